/* plain.d: unnamed argument types (the DTrace guide's style); used without semaphores
 * (usdtpatch dtrace --no-semaphores) and with them. */
provider plain {
    probe enter(int, char *);
    probe leave(int);
    probe tick();
};
