//! Child processes that end with their parent: a worker or an exporter whose parent run
//! was killed must not go on computing (and writing records) as an orphan.

use std::process::Command;

/// Makes the child started by `cmd` receive SIGKILL when the thread that starts it ends
/// (Linux `PR_SET_PDEATHSIG`); a child whose parent is already gone when it starts exits
/// at once. `cmd` must be spawned and waited for on one thread (every caller does).
pub fn end_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: prctl, getppid and _exit are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Whether the process that started this one is still its parent (false once it died
/// and this process was re-parented).
pub fn parent_alive(parent: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getppid has no preconditions.
        (unsafe { libc::getppid() }) as u32 == parent
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = parent;
        true
    }
}
