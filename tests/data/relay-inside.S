#include <sys/sdt.h>
	.text
	.globl	inside
	.type	inside, @function
inside:
	.cfi_startproc
	pushq	%rbx
	.cfi_def_cfa_offset 16
	movq	%rdi, %rbx
1:	STAP_PROBE(relay, inside)
	.byte 0x66
	leaq	counter@tlsgd(%rip), %rdi
2:	.value 0x6666
	rex64
	call	__tls_get_addr@PLT
	addq	%rbx, (%rax)
	decq	%rbx
	jg	2b
	popq	%rbx
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size	inside, .-inside
	.globl counter
	.section .tbss,"awT",@nobits
	.align 8
	.type counter, @object
	.size counter, 8
counter:
	.zero 8
	.section .note.GNU-stack,"",@progbits
