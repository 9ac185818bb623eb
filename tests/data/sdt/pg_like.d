/* pg_like.d: type names defined with cpp, as PostgreSQL's probes.d does; needs dtrace -C. */
#define LocalTransactionId unsigned int
#define Oid unsigned int
#define ForkNumber int
#define bool unsigned char

provider pglike {
    probe transaction__start(LocalTransactionId);
    probe transaction__commit(LocalTransactionId);
    probe buffer__read__start(ForkNumber, Oid, Oid, Oid, bool);
    probe lock__wait__start(unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, LOCKMODE_T);
};
