"""Findings and reports: the data (findings, JSON documents) and their rendering."""
