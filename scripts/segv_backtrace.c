/* LD_PRELOAD'ed by the device scripts where gdb is missing: on SIGSEGV, SIGBUS or SIGABRT,
   prints the faulting pc and every frame's library and symbol, then exits 128+signal.
   gcc -O1 -shared -fPIC -o segv.so scripts/segv_backtrace.c */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
static void frame(const char* tag, void* pc) {
  char buf[768]; Dl_info d; int len;
  if (dladdr(pc, &d) && d.dli_fname)
    len = snprintf(buf, sizeof buf, "%s %p %s+0x%lx (%s+0x%lx)\n", tag, pc, d.dli_fname,
                   (unsigned long)((char*)pc - (char*)d.dli_fbase), d.dli_sname ? d.dli_sname : "?",
                   d.dli_saddr ? (unsigned long)((char*)pc - (char*)d.dli_saddr) : 0ul);
  else len = snprintf(buf, sizeof buf, "%s %p ?\n", tag, pc);
  write(2, buf, len);
}
static void on_fault(int sig, siginfo_t* si, void* ctx) {
  char buf[192]; int len = snprintf(buf, sizeof buf, "NATIVE signal %d at address %p\n", sig, si->si_addr);
  write(2, buf, len);
  frame("NATIVE pc", (void*)((ucontext_t*)ctx)->uc_mcontext.gregs[REG_RIP]);
  /* The registers that carry a leaf function's arguments, then a scan of the stack for
     return addresses (words that fall in a loaded object): backtrace() below may itself
     fault on a damaged stack, and a libc leaf (strlen, memcpy) keeps no frame. */
  greg_t* g = ((ucontext_t*)ctx)->uc_mcontext.gregs;
  len = snprintf(buf, sizeof buf, "NATIVE rdi %llx rsi %llx rdx %llx rsp %llx\n", (unsigned long long)g[REG_RDI],
                 (unsigned long long)g[REG_RSI], (unsigned long long)g[REG_RDX], (unsigned long long)g[REG_RSP]);
  write(2, buf, len);
  void** sp = (void**)g[REG_RSP];
  int shown = 0;
  for (int i = 0; i < 1024 && shown < 60; i++) {
    Dl_info d;
    if (dladdr(sp[i], &d) && d.dli_fname) { frame("NATIVE stack", sp[i]); shown++; }
  }
  void* bt[48]; int n = backtrace(bt, 48);
  for (int i = 0; i < n; i++) frame("NATIVE #", bt[i]);
  _exit(128 + sig);
}
/* Every thread gets an alternate signal stack too (sigaltstack is per thread): without it a
   stack overflow in a worker thread kills the process before the handler can run. */
struct start { void* (*fn)(void*); void* arg; };
static void* with_altstack(void* p) {
  struct start s = *(struct start*)p; free(p);
  stack_t ss; memset(&ss, 0, sizeof ss);
  ss.ss_size = 1 << 16; ss.ss_sp = malloc(ss.ss_size);
  if (ss.ss_sp) sigaltstack(&ss, 0);
  return s.fn(s.arg);
}
int pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*fn)(void*), void* arg) {
  static int (*real)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  if (!real) real = (int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*))dlsym(RTLD_NEXT, "pthread_create");
  struct start* s = malloc(sizeof *s);
  if (!s) return real(t, a, fn, arg);
  s->fn = fn; s->arg = arg;
  size_t sz = 0;
  if (a && pthread_attr_getstacksize(a, &sz) == 0) {
    char buf[96]; int len = snprintf(buf, sizeof buf, "NATIVE thread created, stack %zu bytes\n", sz);
    write(2, buf, len);
  }
  return real(t, a, with_altstack, s);
}
__attribute__((constructor)) static void install(void) {
  /* An alternate stack, so that a stack overflow is reported too (for the thread that
     loads the library; sigaltstack is per thread). */
  static char alt[1 << 16];
  stack_t ss; memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt; ss.ss_size = sizeof alt;
  sigaltstack(&ss, 0);
  struct sigaction sa; memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0); sigaction(SIGBUS, &sa, 0); sigaction(SIGABRT, &sa, 0);
}
