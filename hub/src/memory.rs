//! Giving memory back to the system once start-up is done.
//!
//! A hub's first start compiles its plugins. Two things it touches then are
//! never needed again, yet would stay resident for the life of the process:
//! the embedded built-in components (read once to compile them; a restart
//! maps their compiled code from the cache and never reads them), and the
//! compiler's working memory, freed to the allocator, which keeps it until
//! its decay timers run out. [`release_static`] and [`release_freed`] return
//! both at once.

use std::sync::OnceLock;

/// How the process's allocator returns freed memory to the system at once;
/// set by the binary that chose the allocator.
static ALLOCATOR_RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets the allocator's release hook (once; later calls are ignored).
pub fn set_allocator_release(release: fn()) {
    let _ = ALLOCATOR_RELEASE.set(release);
}

/// Returns the memory the allocator holds freed to the system, when the
/// binary set a hook for it ([`set_allocator_release`]); else nothing.
pub fn release_freed() {
    if let Some(release) = ALLOCATOR_RELEASE.get() {
        release();
    }
}

/// Drops the whole pages of `bytes` from this process's resident set.
///
/// `bytes` must be read-only data of the binary (`include_bytes!`): such
/// pages are a private mapping of the executable that is never written, so
/// the kernel reads them back from the file, unchanged, if they are touched
/// again. Partial pages at either end are left alone (they may hold other
/// data).
#[allow(unsafe_code)]
pub fn release_static(bytes: &'static [u8]) {
    let Some((start, len)) = whole_pages(bytes.as_ptr_range()) else {
        return;
    };
    // SAFETY: the range holds whole pages of `bytes` only, which are
    // immutable `'static` data of the executable's read-only segment (no
    // relocations, never written), mapped privately from the file.
    // MADV_DONTNEED on such pages discards this process's copy of the page
    // table entries; the next access faults the same contents back in from
    // the file. No Rust reference observes a change. A failure (EINVAL on an
    // unusual mapping) leaves the pages as they were, which is harmless.
    unsafe {
        libc::madvise(start, len, libc::MADV_DONTNEED);
    }
}

/// The whole pages inside `range` (start and length), if any: partial
/// pages at either end may hold other data.
#[allow(unsafe_code)]
fn whole_pages(range: std::ops::Range<*const u8>) -> Option<(*mut libc::c_void, usize)> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page).ok().filter(|p| *p > 0)?;
    let start = (range.start as usize).next_multiple_of(page);
    let end = range.end as usize / page * page;
    (end > start).then_some((start as *mut libc::c_void, end - start))
}

/// Asks the kernel to reclaim the whole pages of `range` now (Linux's
/// `MADV_PAGEOUT`): for clean pages mapped from a file, such as compiled
/// plugin code mapped from the compilation cache, they leave the resident
/// set and are read back from the page cache when touched. Unlike
/// `MADV_DONTNEED` it never discards data (a page that was written is
/// swapped out or left alone), so it is safe on any mapping. Kernels
/// without it (before 5.4) refuse it, which leaves the pages resident.
#[allow(unsafe_code)]
pub fn page_out(range: std::ops::Range<*const u8>) {
    let Some((start, len)) = whole_pages(range) else {
        return;
    };
    // SAFETY: MADV_PAGEOUT is advice: it changes which pages are resident,
    // never their contents (dirty private pages are swapped or kept), so no
    // memory that Rust code may read changes. An invalid range is refused
    // with an error, which is ignored.
    unsafe {
        libc::madvise(start, len, libc::MADV_PAGEOUT);
    }
}

/// jemalloc's options for the hub's processes, read when
/// it starts; `_RJEM_MALLOC_CONF` in the environment still overrides them.
/// - `percpu_arena:percpu`: one arena per CPU, a thread allocating from the
///   arena of the CPU it runs on, instead of four arenas per CPU shared out
///   among the threads. The hub's long-lived objects (stored TrainJobs,
///   the dispatcher's entries) are allocated by whichever thread served the
///   request, among short-lived values; fewer arenas leave fewer pages
///   partly used once a burst's values are freed.
/// - `dirty_decay_ms:1000`: freed pages go back to the system within a
///   second (the background threads purge them) rather than ten.
///
/// Together, in the `api` bench: 89 MiB settled per 10,000 TrainJobs
/// instead of 102 to 107 (docs/benchmarks.md), with no lower create rate.
pub const JEMALLOC_CONF: &std::ffi::CStr = c"percpu_arena:percpu,dirty_decay_ms:1000";

/// The global allocator of the hub's binary and of its benches, which
/// measure what it does: jemalloc, with [`JEMALLOC_CONF`]. Expands to
/// items; the crate using it depends on `tikv-jemallocator`.
#[macro_export]
macro_rules! jemalloc {
    () => {
        /// jemalloc rather than the system allocator: the process allocates
        /// and frees many small objects (JSON values, protobuf messages)
        /// across threads, where glibc's malloc cost a sixth of the CPU
        /// (docs/benchmarks.md).
        #[global_allocator]
        static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

        /// jemalloc's options: [`trainhub::memory::JEMALLOC_CONF`].
        // SAFETY: jemalloc reads this symbol once, at its start, as a
        // pointer to a NUL-terminated string; it points at static,
        // immutable bytes that end in NUL.
        #[allow(unsafe_code, non_upper_case_globals)]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        static malloc_conf: Option<&'static u8> =
            $crate::memory::JEMALLOC_CONF.to_bytes_with_nul().first();
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    static DATA: [u8; 3 * 65536] = [7; 3 * 65536];

    #[test]
    fn released_static_pages_read_back_unchanged() {
        let bytes: &'static [u8] = &DATA;
        let sum = |b: &[u8]| b.iter().map(|&x| u64::from(x)).sum::<u64>();
        assert_eq!(sum(bytes), 7 * 3 * 65536);
        release_static(bytes);
        assert_eq!(sum(bytes), 7 * 3 * 65536);
    }

    #[test]
    fn paged_out_pages_read_back_unchanged() {
        let data: Vec<u8> = (0..4 * 65536).map(|i| (i % 251) as u8).collect();
        let before: u64 = data.iter().map(|&x| u64::from(x)).sum();
        page_out(data.as_ptr_range());
        assert_eq!(data.iter().map(|&x| u64::from(x)).sum::<u64>(), before);
    }

    #[test]
    fn the_release_hook_runs_once_set() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        fn count() {
            CALLS.fetch_add(1, Ordering::SeqCst);
        }
        set_allocator_release(count);
        release_freed();
        assert!(CALLS.load(Ordering::SeqCst) >= 1);
    }
}
