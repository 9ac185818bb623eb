/* SDT fixture (assembler): the assembler-side STAP_PROBEn macros, argument specs written
   out by hand.  Assembled with systemtap's <sys/sdt.h> and with usdtpatch's. */
#include <sys/sdt.h>
	.text
	.globl	asm_probes
	.type	asm_probes, @function
asm_probes:
	STAP_PROBE(asmfix, zero)
	STAP_PROBE1(asmfix, one, -4@%edi)
	STAP_PROBE3(asmfix, three, 8@%rsi, -8@8(%rsp), 4@sym_in_data(%rip))
	STAP_PROBE12(asmfix, twelve, 1@%al, 2@%bx, 4@%ecx, 8@%rdx, -1@$1, -2@$2, -4@$-3, -8@$4, 8@(%rdi,%rsi,8), 8@-16(%rbp), 8f@%xmm0, 8@%r15)
	mov	%edi, %eax
	ret
	.size	asm_probes, .-asm_probes
	.data
sym_in_data:
	.long 5
	.section .note.GNU-stack,"",@progbits
