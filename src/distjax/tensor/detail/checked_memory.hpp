// The checked device's memory: page-aligned blocks in one reserved address range, kept
// PROT_NONE except while something opens them (a kernel of the table, or a HostAccess of
// a communication backend). A host access to a closed block faults; the SIGSEGV handler
// recognises the range and reports the access naming the last op the thread dispatched.
// Addresses are never reused, so a use after free faults too.
#pragma once

#include <cstddef>

namespace distjax::tensor::detail::checked {

/// A block of at least `nbytes` (one page at least), closed.
void* alloc(std::size_t nbytes);
/// Releases a block from alloc (its pages go back to the system; the addresses stay closed).
void free(void* p, std::size_t nbytes);

/// Whether `p` lies in the checked device's address range.
bool contains(const void* p);
/// Opens the block containing `p` for host access (counted: nested and concurrent opens
/// of one block are fine); close() undoes one open().
void open(const void* p);
void close(const void* p);

/// Records the op the calling thread is running, for the fault report. `op` must outlive
/// the thread's use (a string literal).
void set_last_op(const char* op);

}  // namespace distjax::tensor::detail::checked
