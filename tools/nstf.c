/* nstf.c — placeholder CLI entry (replaced by the real CLI). */
#include <stdio.h>
int main(void) { puts("nstf"); return 0; }
