//! The plugin's heap in wasm: an arena that is never given back.
//!
//! The hub calls every export on a fresh instance and throws the instance
//! away afterwards, so nothing a call allocates outlives it. A general
//! allocator (std's dlmalloc) spends its time keeping free lists for reuse
//! that never comes; here an allocation moves a pointer, freeing the most
//! recent allocation moves it back, and growing the most recent allocation
//! (a `Vec` or `String` being filled, serde's common case) happens in place.
//! Anything else freed is left where it is until the instance goes.
//!
//! The price is memory: a call that allocates and frees in a long loop uses
//! more than with dlmalloc, and fails at the plugin's memory cap rather than
//! reusing. A plugin that needs reuse turns the SDK's `arena` feature off
//! (`default-features = false`) and gets std's allocator back.

#![allow(unsafe_code)] // A global allocator is unsafe by definition; the invariants are below.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;

/// Bytes in a wasm page.
const PAGE: usize = 65_536;
/// The arena grows by at least this many pages at a time.
const MIN_GROWTH_PAGES: usize = 4;

/// Bump allocator over pages taken from `memory.grow`.
pub struct Arena {
    /// The next free byte, and the end of the pages taken so far.
    next: Cell<usize>,
    end: Cell<usize>,
}

unsafe extern "C" {
    /// Where the linker put the end of static data and the stack: the heap
    /// starts here.
    static __heap_base: u8;
}

impl Arena {
    pub const fn new() -> Self {
        Arena {
            next: Cell::new(0),
            end: Cell::new(0),
        }
    }

    /// Takes pages for at least `size` bytes aligned to `align`; null when the
    /// memory cannot grow (the host's cap).
    fn grow(&self, size: usize, align: usize) -> *mut u8 {
        let Some(want) = size.checked_add(align) else {
            return core::ptr::null_mut();
        };
        let pages = want.div_ceil(PAGE).max(MIN_GROWTH_PAGES);
        let previous = core::arch::wasm32::memory_grow(0, pages);
        if previous == usize::MAX {
            return core::ptr::null_mut();
        }
        let base = previous * PAGE;
        let end = base + pages * PAGE;
        // Contiguous with what the arena had: keep filling from `next`.
        let from = if base == self.end.get() {
            self.next.get()
        } else {
            base
        };
        let start = align_up(from, align);
        self.next.set(start + size);
        self.end.set(end);
        start as *mut u8
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

// SAFETY: a wasm32-wasip2 component runs one thread; nothing else touches the
// cells.
unsafe impl Sync for Arena {}

// SAFETY: every block returned lies in pages this arena took from
// `memory.grow` and handed out once (`next` only moves back over the most
// recent block, when it is freed); blocks are aligned as asked; on failure
// the null pointer is returned, as `GlobalAlloc` requires.
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.end.get() == 0 {
            // First allocation: the heap is the initial memory past the
            // linker's `__heap_base`.
            self.next.set(&raw const __heap_base as usize);
            self.end.set(core::arch::wasm32::memory_size(0) * PAGE);
        }
        let start = align_up(self.next.get(), layout.align());
        match start.checked_add(layout.size()) {
            Some(next) if next <= self.end.get() => {
                self.next.set(next);
                start as *mut u8
            }
            _ => self.grow(layout.size(), layout.align()),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ptr as usize + layout.size() == self.next.get() {
            self.next.set(ptr as usize);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let at = ptr as usize;
        if at + layout.size() == self.next.get()
            && let Some(next) = at.checked_add(new_size)
            && next <= self.end.get()
        {
            self.next.set(next);
            return ptr;
        }
        // SAFETY: as `GlobalAlloc::realloc` documents: a new block, the old
        // contents copied, the old block freed.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            let new = self.alloc(new_layout);
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}
