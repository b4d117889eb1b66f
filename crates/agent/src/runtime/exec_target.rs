//! Whether a program about to be executed can take the agent.
//!
//! A traced program's exec passes `LD_PRELOAD` with the agent on. The
//! dynamic loader of a 32-bit program ignores the 64-bit agent but says so
//! on the program's stderr ("ERROR: ld.so: object ... cannot be preloaded
//! (wrong ELF class: ELFCLASS64): ignored."), and musl's loader fails on
//! the agent's glibc symbols, so that the program never starts. For such a
//! target the exec hooks (`hooks/process.rs`) drop the agent from
//! `LD_PRELOAD`: it runs untraced, as it would have run without trapline.
//!
//! Everything here works without allocating, in stack buffers: shells
//! (dash, bash for simple commands) exec from a vfork child, which shares
//! the parent's memory. A script, a static program, a file that cannot be
//! read or an environment too large for the buffers keeps the agent.

use core::ffi::{c_char, CStr};

/// Whether the program at `path` (the exec's own path, resolved against
/// PATH for `execvp` when `search`; null: no) cannot take the agent.
pub fn is_foreign_path(path: *const c_char, search: bool) -> bool {
    if path.is_null() {
        return false;
    }
    // SAFETY: a C string (checked non-null: the exec functions' contract).
    let path = unsafe { CStr::from_ptr(path) };
    let name = path.to_bytes();
    if name.is_empty() {
        return false;
    }
    if !search || name.contains(&b'/') {
        return is_foreign_at(path);
    }
    // SAFETY: getenv returns null or a C string of the environment.
    let var = unsafe { libc::getenv(c"PATH".as_ptr()) };
    let dirs: &[u8] = if var.is_null() {
        b"/bin:/usr/bin"
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(var) }.to_bytes()
    };
    for dir in dirs.split(|&b| b == b':') {
        let dir = if dir.is_empty() { b".".as_slice() } else { dir };
        let mut candidate = [0u8; 4096];
        let len = dir.len() + 1 + name.len();
        if len >= candidate.len() {
            continue;
        }
        candidate[..dir.len()].copy_from_slice(dir);
        candidate[dir.len()] = b'/';
        candidate[dir.len() + 1..len].copy_from_slice(name);
        let Ok(candidate) = CStr::from_bytes_until_nul(&candidate) else {
            continue;
        };
        // The first executable regular file, as execvp skips directories.
        // SAFETY: a zeroed stat is valid; a NUL-terminated path.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let regular = unsafe { libc::stat(candidate.as_ptr(), &mut st) } == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFREG;
        // SAFETY: a NUL-terminated path.
        if regular && unsafe { libc::access(candidate.as_ptr(), libc::X_OK) } == 0 {
            return is_foreign_at(candidate);
        }
    }
    false
}

/// `is_foreign_fd` of what `execveat(dirfd, path, ..., flags)` would run.
pub fn is_foreign_at_dir(dirfd: i32, path: *const c_char, flags: i32) -> bool {
    if path.is_null() {
        return false;
    }
    // SAFETY: a C string (checked non-null: execveat's contract).
    let name = unsafe { CStr::from_ptr(path) };
    if name.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
        return is_foreign_fd(dirfd);
    }
    // SAFETY: a zeroed stat is valid; a NUL-terminated path.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, 0) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        // Not a regular file (opening a FIFO or a device can do things).
        return false;
    }
    // SAFETY: opening a regular file for reading.
    let fd = unsafe {
        libc::openat(
            dirfd,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let foreign = is_foreign_fd(fd);
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    foreign
}

/// `is_foreign_fd` of the regular file at `path`.
fn is_foreign_at(path: &CStr) -> bool {
    is_foreign_at_dir(libc::AT_FDCWD, path.as_ptr(), 0)
}

/// Reads `buf.len()` bytes at `offset` of `fd`; false if it cannot.
fn read_at(fd: i32, buf: &mut [u8], offset: u64) -> bool {
    // SAFETY: pread into a buffer we own, of its length.
    let n = unsafe {
        libc::pread(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            offset as libc::off_t,
        )
    };
    n == buf.len() as isize
}

/// Whether `fd` (an open regular file) is a dynamically linked ELF program
/// that glibc's loader for the agent's architecture does not start.
pub fn is_foreign_fd(fd: i32) -> bool {
    trapline_contract::elf::program_start(&mut |offset, buf| read_at(fd, buf, offset))
        .is_foreign_to(crate::platform::arch::ELF_MACHINE)
}

/// Most entries an environment without the agent is built for.
pub const MAX_ENTRIES: usize = 512;

/// An environment without the agent, in caller-owned storage (no
/// allocation: a vfork child may build it).
pub struct EnvWithoutAgent {
    entries: [*const c_char; MAX_ENTRIES + 1],
    preload: [u8; 2048],
}

impl EnvWithoutAgent {
    pub const fn new() -> EnvWithoutAgent {
        EnvWithoutAgent {
            entries: [core::ptr::null(); MAX_ENTRIES + 1],
            preload: [0; 2048],
        }
    }

    /// `envp` with the agent taken out of `LD_PRELOAD` (the variable
    /// dropped if nothing else is in it) and without the entries `skip`
    /// names; `None` when it does not fit (then `envp` is used as it is).
    pub fn build(
        &mut self,
        envp: *const *const c_char,
        skip: impl Fn(&[u8]) -> bool,
    ) -> Option<*const *const c_char> {
        if envp.is_null() {
            return None;
        }
        let mut n = 0;
        let mut i = 0;
        loop {
            // SAFETY: envp is a NULL-terminated array of C strings.
            let e = unsafe { *envp.add(i) };
            if e.is_null() {
                break;
            }
            i += 1;
            // SAFETY: as above.
            let bytes = unsafe { CStr::from_ptr(e) }.to_bytes();
            if skip(bytes) {
                continue;
            }
            let entry = match bytes.strip_prefix(b"LD_PRELOAD=") {
                Some(list) => match self.preload_without_agent(list) {
                    Some(p) => p,
                    None => continue,
                },
                None => e,
            };
            if n == MAX_ENTRIES {
                return None;
            }
            self.entries[n] = entry;
            n += 1;
        }
        self.entries[n] = core::ptr::null();
        Some(self.entries.as_ptr())
    }

    /// `LD_PRELOAD=` with `list` minus the agent, in `preload`; `None` when
    /// nothing is left.
    fn preload_without_agent(&mut self, list: &[u8]) -> Option<*const c_char> {
        const NAME: &[u8] = b"LD_PRELOAD=";
        self.preload[..NAME.len()].copy_from_slice(NAME);
        let mut at = NAME.len();
        for lib in list.split(|&b| b == b':' || b == b' ') {
            if lib.is_empty() || trapline_contract::env::names_agent(lib) {
                continue;
            }
            if at + lib.len() + 2 > self.preload.len() {
                break;
            }
            if at > NAME.len() {
                self.preload[at] = b':';
                at += 1;
            }
            self.preload[at..at + lib.len()].copy_from_slice(lib);
            at += lib.len();
        }
        if at == NAME.len() {
            return None;
        }
        self.preload[at] = 0;
        Some(self.preload.as_ptr().cast())
    }
}
