/* probedemo._probes: checksum(bytes) -> int, with probes at the start and end of each call, one
 * per 4 KiB block and one in a red-zone leaf.
 * Built with systemtap's <sys/sdt.h> (1-byte NOP sites); usdtpatch's build_ext rewrites
 * them into 5-byte NOP sites when the module is linked. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sys/sdt.h>

/* A leaf function that keeps live data in the red zone below %rsp across its probe: its site
 * needs usdtpatch's red-zone guard (guard = "auto", the default). */
__attribute__((noipa)) static long mix(long x)
{
    long buf[12];
    for (int i = 0; i < 12; i++)
        buf[i] = x * (i + 1) + i;
    __asm__ volatile("" ::"r"(buf) : "memory");
    DTRACE_PROBE2(probedemo, mix, x, buf[5]);
    __asm__ volatile("" ::: "memory");
    long s = 0;
    for (int i = 0; i < 12; i++)
        s = s * 3 + buf[i];
    return s;
}

static PyObject *checksum(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    unsigned long long sum = 1469598103934665603ULL;
    DTRACE_PROBE2(probedemo, start, p, view.len);
    for (Py_ssize_t i = 0; i < view.len; i++) {
        sum = (sum ^ p[i]) * 1099511628211ULL;
        if ((i & 4095) == 4095)
            DTRACE_PROBE2(probedemo, block, i, sum);
    }
    PyBuffer_Release(&view);
    sum ^= (unsigned long long)mix((long)view.len);
    PyObject *result = PyLong_FromUnsignedLongLong(sum);
    DTRACE_PROBE2(probedemo, done, sum, result);
    return result;
}

static PyMethodDef methods[] = {
    {"checksum", checksum, METH_O, "FNV-1a of a bytes-like object."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "probedemo._probes", NULL, -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__probes(void) { return PyModule_Create(&module); }
