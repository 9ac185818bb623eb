/* app.d: a provider file with typed, named arguments (the shape PostgreSQL, CPython and
 * QEMU write), used with semaphores (dtrace -h's default) by tests/test_dtrace_cmd.py. */
#pragma D attributes Evolving/Evolving/Common provider app provider

provider app {
    probe start();
    probe request__begin(const char *path, unsigned long long id, int method);
    probe request__end(const char *path, long status, double seconds);
    probe bytes(unsigned char *buf, unsigned int len);
    probe twelve(int a, long b, short c, unsigned char d, signed char e, long long f,
                 unsigned short g, unsigned int h, unsigned long i, char *j, void *k, int l);
};

provider app_gc {
    probe collect(int generation);
    probe done(long collected);
};
