//! Replacing a file all at once: the new contents go to a temporary sibling, are synced
//! to disk and renamed over the old file. A crash, a kill or a full disk in the middle
//! leaves the old file as it was (and at worst a `.tmp-` sibling), never a cut-short one.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary sibling `path`'s new contents are written to before the rename.
fn temporary_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".tmp-{}-{name}", std::process::id()))
}

/// Writes `bytes` to `path` atomically (temporary sibling, fsync, rename, fsync of the
/// directory), creating the directory. On failure the temporary file is removed, `path`
/// is unchanged, and the error says so in one line.
pub fn replace(path: &Path, bytes: &[u8]) -> Result<()> {
    replace_with(path, |w| w.write_all(bytes))
}

/// [`replace`] with the contents streamed by `fill` (large arrays need no copy in memory).
pub fn replace_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = temporary_sibling(path);
    let written = (|| -> std::io::Result<()> {
        let f = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself is durable once the directory is synced.
        if let Ok(d) = std::fs::File::open(&dir) {
            d.sync_all().ok();
        }
        Ok(())
    })();
    if let Err(e) = written {
        std::fs::remove_file(&tmp).ok();
        let old = if path.exists() {
            "the old file is unchanged"
        } else {
            "nothing was written"
        };
        anyhow::bail!("cannot write {}: {e}; {old}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("g.json");
        std::fs::write(&p, "old contents\n").unwrap();
        let e = replace_with(&p, |w| {
            w.write_all(b"half of the new")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "cannot write {}: disk full; the old file is unchanged",
                p.display()
            )
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old contents\n");
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "a temporary file was left behind");
        replace(&p, b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new\n");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
