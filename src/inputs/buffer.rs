//! Large zeroed f32 buffers, backed by transparent huge pages where the kernel offers
//! them and faulted in up front, in parallel.
//!
//! A fresh [B,T,V] logits buffer (5 GB at T = 8192, V = 151936) is allocated zeroed and
//! untouched (`calloc` maps zero pages lazily), so every 4 KiB page faults on its first
//! write: 1.2 million faults. With transparent huge pages in `madvise` mode (a common
//! default), advising the range `MADV_HUGEPAGE` makes each fault map (and zero) 2 MiB at
//! once. The pages are then touched right away by the rayon workers, one write of +0.0
//! (the value already there) per 4 KiB page, rather than as generation reaches them: the
//! kernel's work is the same, done on every pool thread at once, and the buffer holds its
//! memory before it is needed (on a virtual machine, memory the guest freed a moment ago
//! may be handed back to the host if left free for long, and then faults there too, which
//! costs seconds for 5 GB). The buffer stays an ordinary `Vec<f32>` of zeros: the advice
//! changes neither its contents nor its ownership, and where it is refused or unavailable
//! nothing changes but the speed.

use rayon::prelude::*;

/// Buffers smaller than this are left alone (a few huge pages at most; faulted lazily).
const MIN_ADVISED_BYTES: usize = 64 << 20;

/// Elements per 4 KiB page, the finest granularity pages are faulted at.
const PAGE_ELEMS: usize = 4096 / std::mem::size_of::<f32>();

/// Bytes of a transparent huge page (x86-64, and arm64 with 4 KiB pages).
const HUGE_BYTES: usize = 2 << 20;

/// `vec![0f32; n]`, with its pages advised to be huge (Linux) and, for large buffers,
/// faulted in now on the rayon pool. The contents are +0.0 everywhere, as `vec!` gives.
pub fn zeroed_f32(n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    if std::mem::size_of_val(v.as_slice()) >= MIN_ADVISED_BYTES {
        advise_huge(&v);
        v.par_chunks_mut(HUGE_BYTES / std::mem::size_of::<f32>())
            .for_each(|c| {
                for x in c.iter_mut().step_by(PAGE_ELEMS) {
                    // Volatile: the store must happen (a compiler may know calloc'd memory is
                    // zero already and drop a plain store of zero).
                    // SAFETY: `x` is a valid, aligned, exclusive reference to an f32.
                    unsafe { std::ptr::write_volatile(x, 0.0) };
                }
            });
    }
    v
}

/// Advises the whole pages inside `v` to be transparent huge pages (best effort).
#[cfg(target_os = "linux")]
fn advise_huge(v: &[f32]) {
    let bytes = std::mem::size_of_val(v);
    let start = v.as_ptr() as usize;
    // Whole huge pages inside the allocation (the kernel only uses aligned ones anyway).
    let lo = start.next_multiple_of(HUGE_BYTES);
    let hi = (start + bytes) / HUGE_BYTES * HUGE_BYTES;
    if hi > lo {
        // SAFETY: [lo, hi) lies inside `v`'s allocation and is page-aligned; MADV_HUGEPAGE
        // is advice about how to back the range and never changes the memory's contents.
        let _ = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: &[f32]) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_buffers_are_zero_and_writable() {
        for n in [0, 1, 1000, (MIN_ADVISED_BYTES / 4) + 12345] {
            let mut v = zeroed_f32(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|x| x.to_bits() == 0));
            v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
            assert!(v.iter().enumerate().all(|(i, x)| *x == i as f32));
        }
    }
}
