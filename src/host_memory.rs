//! How much host memory this process may still allocate, and the refusal of a case that
//! needs more, before anything is allocated (instead of an abort on a failed allocation).
//!
//! The bound is the tightest of: `MemAvailable` (`/proc/meminfo`), the address-space and
//! data-segment limits (`RLIMIT_AS`, `RLIMIT_DATA`: `ulimit -v`/`-d`, `prlimit --as`/`--data`)
//! minus what the process already maps, and the memory limit of this process's cgroup and
//! its ancestors (v2 `memory.max`, v1 `memory.limit_in_bytes`) minus what the cgroup uses
//! (not counting reclaimable page cache).

use crate::cases::Case;
use std::path::{Path, PathBuf};

/// One bound on what this process can still allocate, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Headroom {
    /// Bytes still allocatable under this bound.
    pub free: u64,
    /// The bound, for a person, e.g. "the address-space limit RLIMIT_AS of 4.0 GiB
    /// (ulimit -v, prlimit --as)".
    pub source: String,
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Host memory the suite itself needs for this case (inputs, oracle, one set of
/// outputs), in bytes, with rayon's thread count here; `None` when the count
/// overflows. See [`bytes_needed_with`].
pub fn bytes_needed(case: &Case) -> Option<u64> {
    bytes_needed_with(case, rayon::current_num_threads())
}

/// Host memory the suite itself needs for this case when the oracle and the gates run
/// on `threads` threads, in bytes; `None` when the count overflows.
///
/// - Logits level: the f32 logits and the f32 dlogits (8 bytes per element), plus
///   per token row in flight (one per thread, at most one per row) three f64 rows of V
///   (the oracle's exponentials and dlogits row, the gates' (value, scale) row).
/// - Fused level: f32 hidden and lm_head, the oracle's f64 dhidden and dlm_head, f32
///   outputs of both (16 bytes per element); the oracle's f64 copy of hidden (8 bytes
///   per hidden element), its widened tile of lm_head ([H, VT] f64) and its tile of
///   logits ([min(rows, ROW_GROUP), VT] f64, see `oracle::fused`), the one-pass path's
///   held group of whole rows ([min(rows, hold rows), V] f64, at most 1 GiB); and the three f64
///   rows of V per row in flight as at the logits level.
/// - Per-token vectors of inputs, oracle and outputs: 64 bytes per token.
pub fn bytes_needed_with(case: &Case, threads: usize) -> Option<u64> {
    let s = &case.shape;
    let v = s.v as u64;
    let rows = (s.b as u64).checked_mul(s.t as u64)?;
    let small = rows.checked_mul(64)?;
    let in_flight = rows.min(threads.max(1) as u64);
    let rows_of_v = in_flight.checked_mul(3)?;
    let big = match case.level {
        crate::spec::Level::Logits => rows.checked_mul(v)?.checked_mul(8)?,
        crate::spec::Level::Fused => {
            let h = s.h.unwrap_or(0) as u64;
            let hid = rows.checked_mul(h)?;
            let elems = hid.checked_add(h.checked_mul(v)?)?;
            let (vt, group) = (
                crate::oracle::FUSED_TILE as u64,
                crate::oracle::FUSED_ROW_GROUP as u64,
            );
            let tiles = h.checked_add(rows.min(group))?.checked_mul(vt.min(v))?;
            // The one-pass path's held group of whole f64 rows.
            let held = rows
                .min(crate::oracle::fused_hold_rows(s.v) as u64)
                .checked_mul(v)?;
            elems
                .checked_mul(4 + 8 + 4)?
                .checked_add(hid.checked_mul(8)?)?
                .checked_add(tiles.checked_mul(8)?)?
                .checked_add(held.checked_mul(8)?)?
        }
    };
    big.checked_add(rows_of_v.checked_mul(v)?.checked_mul(8)?)?
        .checked_add(small)
}

/// Refuses `case` when its inputs, outputs and oracle would not fit under the tightest
/// bound here; the message (one line) gives the bytes needed, the bytes free and the bound.
pub fn check(case: &Case) -> Result<(), String> {
    let need = bytes_needed(case)
        .ok_or_else(|| format!("{}: shape overflows 64-bit byte counts", case.id))?;
    match tightest(headrooms()) {
        Some(h) if need > h.free => Err(refusal(need, &h)),
        _ => Ok(()),
    }
}

/// The refusal message of a case that needs `need` bytes under `h`.
pub fn refusal(need: u64, h: &Headroom) -> String {
    format!(
        "refused: needs {need} bytes (~{}) of host memory for its inputs, outputs and the oracle, \
         more than the {} bytes (~{}) free under {}",
        gib(need),
        h.free,
        gib(h.free),
        h.source
    )
}

/// The bound with the least free memory.
pub fn tightest(all: Vec<Headroom>) -> Option<Headroom> {
    all.into_iter().min_by_key(|h| h.free)
}

/// Every bound that applies to this process now.
pub fn headrooms() -> Vec<Headroom> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut all: Vec<Headroom> = mem_available().into_iter().collect();
    all.extend(rlimits());
    if let (Some(cg), Some(mi)) = (
        read(Path::new("/proc/self/cgroup")),
        read(Path::new("/proc/self/mountinfo")),
    ) {
        all.extend(cgroup(&cg, &mi, &read));
    }
    all
}

fn mem_available() -> Option<Headroom> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some(Headroom {
        free: kib_field(&text, "MemAvailable:")?,
        source: "this machine's available memory (MemAvailable, /proc/meminfo)".into(),
    })
}

/// The value of a `Key:  N kB` line, in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(target_os = "linux")]
fn rlimits() -> Vec<Headroom> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let one = |res, name: &str, hint: &str, used_key: &str| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(res, &mut l) } != 0 || l.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
        let limit = l.rlim_cur as u64;
        let used = kib_field(&status, used_key).unwrap_or(0);
        Some(Headroom {
            free: limit.saturating_sub(used),
            source: format!(
                "the {name} of {} ({hint}; {} of it already mapped)",
                gib(limit),
                gib(used)
            ),
        })
    };
    [
        one(
            libc::RLIMIT_AS,
            "address-space limit RLIMIT_AS",
            "ulimit -v, prlimit --as",
            "VmSize:",
        ),
        one(
            libc::RLIMIT_DATA,
            "data-segment limit RLIMIT_DATA",
            "ulimit -d, prlimit --data",
            "VmData:",
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(not(target_os = "linux"))]
fn rlimits() -> Vec<Headroom> {
    Vec::new()
}

/// cgroup v1 reports "no limit" as a huge page-aligned number.
const V1_UNLIMITED: u64 = 1 << 60;

/// The memory limits of this process's cgroup and its ancestors, from the text of
/// `/proc/self/cgroup` and `/proc/self/mountinfo`, reading control files with `read`:
/// cgroup v2 (`memory.max`, `memory.current`) and v1 (`memory.limit_in_bytes`,
/// `memory.usage_in_bytes`); usage does not count inactive page cache (`memory.stat`).
pub fn cgroup(
    proc_cgroup: &str,
    mountinfo: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Vec<Headroom> {
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(hier), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v2 = hier == "0" && ctrls.is_empty();
        if !v2 && !ctrls.split(',').any(|c| c == "memory") {
            continue;
        }
        let Some((root, mount)) = mount_of(mountinfo, v2) else {
            continue;
        };
        let rel = if root == "/" {
            path
        } else {
            match path.strip_prefix(root.as_str()) {
                Some(r) => r,
                None => continue,
            }
        };
        let rel = rel.trim_start_matches('/');
        let mut dir = if rel.is_empty() {
            mount.clone()
        } else {
            mount.join(rel)
        };
        loop {
            out.extend(level(&dir, v2, read));
            if dir == mount || !dir.pop() || !dir.starts_with(&mount) {
                break;
            }
        }
    }
    out
}

/// (root inside the hierarchy, mount point) of the cgroup2 mount, or of the v1 mount with
/// the memory controller.
fn mount_of(mountinfo: &str, v2: bool) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        let (fstype, opts) = (*post.first()?, post.get(2).copied().unwrap_or(""));
        let ok = if v2 {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup" && opts.split(',').any(|o| o == "memory")
        };
        if !ok {
            return None;
        }
        Some((pre.get(3)?.to_string(), PathBuf::from(pre.get(4)?)))
    })
}

/// The headroom under one cgroup directory's limit, if it sets one.
fn level(dir: &Path, v2: bool, read: &dyn Fn(&Path) -> Option<String>) -> Option<Headroom> {
    let (max_f, cur_f, inactive_key) = if v2 {
        ("memory.max", "memory.current", "inactive_file")
    } else {
        (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        )
    };
    let num = |f: &str| read(&dir.join(f))?.trim().parse::<u64>().ok();
    let limit = num(max_f)?; // "max" (v2) does not parse: no limit
    if !v2 && limit >= V1_UNLIMITED {
        return None;
    }
    let inactive = read(&dir.join("memory.stat"))
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                if k != inactive_key {
                    return None;
                }
                v.trim().parse::<u64>().ok()
            })
        })
        .unwrap_or(0);
    let used = num(cur_f).unwrap_or(0).saturating_sub(inactive);
    Some(Headroom {
        free: limit.saturating_sub(used),
        source: format!(
            "the cgroup memory limit of {} ({}; {} of it in use)",
            gib(limit),
            dir.join(max_f).display(),
            gib(used)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn fs(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, c)| (PathBuf::from(p), c.to_string()))
            .collect();
        move |p: &Path| m.get(p).cloned()
    }

    #[test]
    fn cgroup_limits_of_v2_and_v1_and_their_ancestors_are_read() {
        let g = 1u64 << 30;
        // v2: the process's own cgroup has no limit ("max"), its parent has 4 GiB with
        // 1.5 GiB used of which 0.5 GiB is inactive page cache.
        let mi = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let read = fs(&[
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", &format!("{}\n", 4 * g)),
            (
                "/sys/fs/cgroup/a/memory.current",
                &format!("{}\n", 3 * g / 2),
            ),
            (
                "/sys/fs/cgroup/a/memory.stat",
                &format!("anon 1\ninactive_file {}\n", g / 2),
            ),
        ]);
        let h = cgroup("0::/a/b\n", mi, &read);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[0].free, 3 * g);
        assert!(
            h[0].source.contains("/sys/fs/cgroup/a/memory.max") && h[0].source.contains("4.0 GiB"),
            "{}",
            h[0].source
        );
        // v1 (the memory controller mounted at a root inside the hierarchy): the huge
        // "unlimited" value is no limit.
        let mi = "35 31 0:32 /outer /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                  36 31 0:33 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        let read = fs(&[
            (
                "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
                &format!("{}\n", 2 * g),
            ),
            (
                "/sys/fs/cgroup/memory/job/memory.usage_in_bytes",
                &format!("{g}\n"),
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let h = cgroup("4:memory:/outer/job\n3:cpu:/outer/job\n", mi, &read);
        assert_eq!(h, vec![Headroom { free: g, source: "the cgroup memory limit of 2.0 GiB (/sys/fs/cgroup/memory/job/memory.limit_in_bytes; 1.0 GiB of it in use)".into() }]);
        // Neither: no bound.
        assert!(cgroup("0::/\n", mi, &fs(&[])).is_empty());
    }

    #[test]
    fn the_tightest_bound_is_named_with_bytes() {
        let t = tightest(vec![
            Headroom {
                free: 10,
                source: "a".into(),
            },
            Headroom {
                free: 3,
                source: "b".into(),
            },
        ])
        .unwrap();
        assert_eq!(t.source, "b");
        let m = refusal(5 << 30, &t);
        assert!(
            m.contains("5368709120 bytes") && m.contains("3 bytes") && m.ends_with("under b"),
            "{m}"
        );
    }
}

#[cfg(test)]
mod bytes_tests {
    use super::*;
    use crate::cases::parse_fixed;

    #[test]
    fn host_bytes_needed_counts_the_oracle_rows_of_v() {
        // One token at V = 2³¹−1: f32 logits and f32 dlogits are 8·V bytes, and judging
        // the dlogits forms an f64 (value, scale) pair row of V (16·V) on top.
        let v = i32::MAX as u64;
        let c = parse_fixed("b: 1, t: 1, v: 2147483647").unwrap();
        let need = bytes_needed(&c).unwrap();
        assert!(
            need >= 24 * v,
            "counts {need} bytes, less than 24·V = {}",
            24 * v
        );
    }

    #[test]
    fn host_bytes_needed_counts_the_fused_oracle_copies_and_tiles() {
        // The seeds' shape: 16 bytes per input element, 8 more per hidden element (the
        // oracle's f64 copy), the f64 tiles [H, 2048] and [4096, 2048], and the one-pass
        // path's held rows: 2³⁰ / (8·V) = 883 whole f64 rows.
        let c = parse_fixed("level: fused, b: 1, t: 8192, h: 4096, v: 151936").unwrap();
        let (rows, h, v) = (8192u64, 4096u64, 151936u64);
        let held = (1u64 << 30) / (8 * v) * v * 8;
        let want = 16 * (rows * h + h * v) + 8 * rows * h + 8 * (h + 4096) * 2048 + held;
        let need = bytes_needed_with(&c, 1).unwrap();
        assert!(
            need >= want && need < want + (1 << 20) + 3 * 8 * v,
            "counts {need} bytes, not {want} plus per-token vectors and one row in flight"
        );
    }
}
