//! The plugin's heap in wasm: small blocks from an arena that is never given
//! back.
//!
//! The hub calls every export on a fresh instance and throws the instance
//! away afterwards, so nothing a call allocates outlives it. A general
//! allocator spends its time keeping free lists for reuse that never comes;
//! here a small allocation moves a pointer, freeing the most recent one moves
//! it back, and growing the most recent one (a `Vec` or `String` being
//! filled, serde's common case) happens in place. Any other small block
//! freed stays where it is until the instance goes.
//!
//! The arena takes its chunks from std's allocator (wasi-libc's dlmalloc),
//! which also keeps every large block, so the two never claim the same
//! memory and C code calling `malloc` is safe. Large blocks are freed and
//! reused as usual, so a plugin that allocates big buffers in a loop stays
//! bounded; one that allocates and frees small blocks in a long loop uses
//! more memory than with dlmalloc, and fails at the plugin's memory cap
//! rather than reusing. Such a plugin turns the SDK's `arena` feature off
//! (`default-features = false`).

#![allow(unsafe_code)] // A global allocator is unsafe by definition; the invariants are below.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use std::alloc::System;

/// Bytes in a wasm page.
const PAGE: usize = 64 * 1024;
/// Bytes the arena takes from std's allocator at a time, after its first
/// chunk (the rest of the instance's initial memory).
const CHUNK: usize = 4 * PAGE;
/// Blocks larger than this go to std's allocator directly.
const LARGE: usize = PAGE;
/// The first chunk's size, at most.
const FIRST_CHUNK_MAX: usize = 16 * PAGE;
/// What std's allocator keeps of a chunk for itself, at most.
const SLACK: usize = 256;

unsafe extern "C" {
    /// Where the linker put the end of static data and the stack: the heap
    /// starts here.
    static __heap_base: u8;
}

/// Bump allocator over chunks of std's allocator.
pub struct Arena {
    /// The next free byte of the current chunk, and its end.
    next: Cell<usize>,
    end: Cell<usize>,
}

impl Arena {
    pub const fn new() -> Self {
        Arena {
            next: Cell::new(0),
            end: Cell::new(0),
        }
    }

    /// A new chunk, and `layout`'s block at its start; null when std's
    /// allocator has no memory left (the host's cap).
    fn refill(&self, layout: Layout) -> *mut u8 {
        let size = if self.end.get() == 0 {
            // The first chunk: the initial memory past `__heap_base`, which
            // std's allocator hands out without growing the memory.
            let heap = &raw const __heap_base as usize;
            let initial = core::arch::wasm32::memory_size(0) * PAGE;
            // At most `FIRST_CHUNK_MAX`: if C code grew the memory before
            // Rust allocated anything, that part is not free.
            initial
                .saturating_sub(heap)
                .saturating_sub(SLACK)
                .min(FIRST_CHUNK_MAX)
        } else {
            CHUNK
        };
        let size = if size < layout.size() + layout.align() {
            CHUNK
        } else {
            size
        };
        let Ok(chunk) = Layout::from_size_align(size, layout.align().max(16)) else {
            return core::ptr::null_mut();
        };
        // SAFETY: `chunk` has a non-zero size.
        let base = unsafe { System.alloc(chunk) };
        if base.is_null() {
            return base;
        }
        let start = base as usize;
        self.next.set(start + layout.size());
        self.end.set(start + size);
        base
    }
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

const fn align_up(at: usize, align: usize) -> usize {
    (at + align - 1) & !(align - 1)
}

const fn is_large(layout: &Layout) -> bool {
    layout.size() > LARGE || layout.align() > LARGE
}

// SAFETY: a wasm32-wasip2 component runs one thread; nothing else touches the
// cells.
unsafe impl Sync for Arena {}

// SAFETY: a large block (decided by its layout, which `dealloc` and `realloc`
// receive unchanged) is std's allocator's, and goes back to it. A small block
// lies in a chunk that std's allocator gave this arena and never takes back,
// and is handed out once: `next` only moves back over the most recent block,
// when it is freed. Blocks are aligned as asked (a chunk is aligned to at
// least the block's alignment); on failure the null pointer is returned, as
// `GlobalAlloc` requires.
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(&layout) {
            // SAFETY: as the caller promised for `layout`.
            return unsafe { System.alloc(layout) };
        }
        let start = align_up(self.next.get(), layout.align());
        let next = start + layout.size();
        if self.end.get() != 0 && next <= self.end.get() {
            self.next.set(next);
            start as *mut u8
        } else {
            self.refill(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(&layout) {
            // SAFETY: a large block came from `System.alloc` with this layout.
            unsafe { System.dealloc(ptr, layout) };
        } else if ptr as usize + layout.size() == self.next.get() {
            self.next.set(ptr as usize);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `new_size` is non-zero and fits `isize` when rounded to the
        // alignment, as `GlobalAlloc::realloc` requires of its caller.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if is_large(&layout) && is_large(&new_layout) {
            // SAFETY: a large block came from `System.alloc` with `layout`.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let at = ptr as usize;
        if !is_large(&layout)
            && !is_large(&new_layout)
            && at + layout.size() == self.next.get()
            && at + new_size <= self.end.get()
        {
            self.next.set(at + new_size);
            return ptr;
        }
        // SAFETY: a new block, the old contents copied, the old block freed,
        // as `GlobalAlloc::realloc` documents.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}
