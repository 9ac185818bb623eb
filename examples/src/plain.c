/* plain.c: a program whose probes need no red-zone guard. The CMake example builds it with
 * usdtpatch's own sys/sdt.h (usdtpatch_use_headers: 5-byte NOP sites at build time, nothing
 * to rewrite); the Make and Meson examples build it with systemtap's and rewrite it. */
#include <stdio.h>
#include <string.h>
#include <sys/sdt.h>

static __attribute__((noinline)) int count_words(const char *text)
{
    int words = 0, in_word = 0;
    for (const char *p = text; *p; p++) {
        int letter = *p != ' ';
        if (letter && !in_word) {
            words++;
            DTRACE_PROBE2(plain, word, words, p);
        }
        in_word = letter;
    }
    return words;
}

int main(int argc, char **argv)
{
    const char *text = argc > 1 ? argv[1] : "five words in this text";
    DTRACE_PROBE1(plain, start, argc);
    int n = count_words(text);
    DTRACE_PROBE2(plain, counted, text, n);
    printf("plain: %d words, %zu bytes\n", n, strlen(text));
    return 0;
}
