#include "distjax/tensor/detail/checked_memory.hpp"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "distjax/core/error.hpp"

namespace distjax::tensor::detail::checked {
namespace {

// Address space reserved without memory: blocks are carved from it and never handed out
// twice. 1 TiB where the process may reserve it; less where it may not (ThreadSanitizer
// keeps most of the address space for itself), halving down to 1 GiB.
constexpr std::size_t kArenaMaxBytes = std::size_t(1) << 40;
constexpr std::size_t kArenaMinBytes = std::size_t(1) << 30;

struct Block {
  std::size_t bytes = 0;  // page-rounded
  int opens = 0;
};

struct Arena {
  char* base = nullptr;
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::map<std::uintptr_t, Block> blocks;  // by start address
  std::size_t page = 4096;
  std::size_t bytes = 0;  // the reserved range
};

// Read by the signal handler: set once, before any block exists.
char* g_base = nullptr;
std::size_t g_bytes = 0;
struct sigaction g_previous;

__attribute__((tls_model("initial-exec"))) thread_local const char* t_last_op = nullptr;

void write_str(const char* s) {
  if (s) (void)!::write(STDERR_FILENO, s, std::strlen(s));
}

void write_hex(std::uintptr_t v) {
  char buf[2 + 16 + 1];
  buf[0] = '0';
  buf[1] = 'x';
  for (int i = 0; i < 16; ++i) buf[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 0xf];
  buf[18] = '\0';
  write_str(buf);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  auto* addr = static_cast<char*>(info->si_addr);
  if (g_base && addr >= g_base && addr < g_base + g_bytes) {
    write_str("\n[checked device] the host touched checked-device memory at ");
    write_hex(reinterpret_cast<std::uintptr_t>(addr));
    write_str(" outside the kernel table (a host loop, memcpy or read of tensor data); the last "
              "op this thread dispatched was '");
    write_str(t_last_op ? t_last_op : "(none)");
    write_str("'. Stack:\n");
    void* frames[64];
    const int n = ::backtrace(frames, 64);
    ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
    ::signal(SIGSEGV, SIG_DFL);  // the access faults again on return, and the process dies
    return;
  }
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    ::sigaction(SIGSEGV, &g_previous, nullptr);  // not ours: the default action on return
  }
}

Arena& arena() {
  static Arena* a = [] {
    auto* arena = new Arena;  // never destroyed: blocks may be freed during static destruction
    arena->page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* p = MAP_FAILED;
    std::size_t bytes = kArenaMaxBytes;
    for (; bytes >= kArenaMinBytes; bytes /= 2) {
      p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) break;
    }
    DISTJAX_CHECK(p != MAP_FAILED, Error, "[checked device] cannot reserve its address range (",
                  kArenaMinBytes, " bytes at least): ", std::strerror(errno));
    arena->base = static_cast<char*>(p);
    arena->bytes = bytes;
    g_bytes = bytes;
    g_base = arena->base;
    void* warm[1];
    ::backtrace(warm, 1);  // loads the unwinder now, not inside the signal handler
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, &g_previous);
    return arena;
  }();
  return *a;
}

void protect(std::uintptr_t start, const Block& b, int prot) {
  const int rc = ::mprotect(reinterpret_cast<void*>(start), b.bytes, prot);
  DISTJAX_CHECK(rc == 0, Error, "[checked device] mprotect failed: ", std::strerror(errno));
}

// The block containing p; the caller holds the arena's lock.
std::map<std::uintptr_t, Block>::iterator find_block(Arena& a, const void* p) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  auto it = a.blocks.upper_bound(addr);
  DISTJAX_CHECK(it != a.blocks.begin(), Error, "[checked device] no live block at ", p);
  --it;
  DISTJAX_CHECK(addr < it->first + it->second.bytes || (addr == it->first), Error,
                "[checked device] no live block at ", p, " (freed?)");
  return it;
}

}  // namespace

void* alloc(std::size_t nbytes) {
  Arena& a = arena();
  const std::size_t bytes = (std::max<std::size_t>(nbytes, 1) + a.page - 1) / a.page * a.page;
  // One closed page between blocks, so an overrun faults too.
  const std::size_t offset = a.next.fetch_add(bytes + a.page);
  DISTJAX_CHECK(offset + bytes <= a.bytes, Error,
                "[checked device] its address range is used up (", a.bytes, " bytes)");
  char* p = a.base + offset;
  std::lock_guard<std::mutex> lock(a.mu);
  a.blocks.emplace(reinterpret_cast<std::uintptr_t>(p), Block{bytes, 0});
  return p;
}

void free(void* p, std::size_t) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = find_block(a, p);
  if (it->second.opens > 0) protect(it->first, it->second, PROT_NONE);
  ::madvise(reinterpret_cast<void*>(it->first), it->second.bytes, MADV_DONTNEED);
  a.blocks.erase(it);
}

bool contains(const void* p) {
  const auto* c = static_cast<const char*>(p);
  return g_base && c >= g_base && c < g_base + g_bytes;
}

void open(const void* p) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = find_block(a, p);
  if (it->second.opens++ == 0) protect(it->first, it->second, PROT_READ | PROT_WRITE);
}

void close(const void* p) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = find_block(a, p);
  if (--it->second.opens == 0) protect(it->first, it->second, PROT_NONE);
}

void set_last_op(const char* op) { t_last_op = op; }

}  // namespace distjax::tensor::detail::checked
