/* main.c — placeholder until the CLI lands. */
#include <stdio.h>
int main(void) { puts("llmi"); return 0; }
