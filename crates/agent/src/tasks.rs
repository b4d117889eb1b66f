//! The process's threads as the kernel lists them in /proc/self/task, read
//! without allocating (the scan reads them while other threads are stopped,
//! possibly holding the agent heap's lock).

/// Calls `f` with the tid of every task of the process, until it returns
/// false; `buf` receives the directory entries (getdents64).
pub fn each(buf: &mut [u8], mut f: impl FnMut(u32) -> bool) {
    // SAFETY: opening a directory read-only with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    'read: loop {
        // SAFETY: getdents64 writes at most buf.len() bytes into buf.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let name = &buf[off + 19..off + reclen];
            let digits = name.iter().take_while(|b| b.is_ascii_digit());
            let mut tid = 0u32;
            let mut any = false;
            for d in digits {
                tid = tid.wrapping_mul(10).wrapping_add(u32::from(d - b'0'));
                any = true;
            }
            if any && !f(tid) {
                break 'read;
            }
            if reclen == 0 {
                break;
            }
            off += reclen;
        }
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// How many tasks the process has (`buf` as for `each`).
pub fn count(buf: &mut [u8]) -> u32 {
    let mut n = 0;
    each(buf, |_| {
        n += 1;
        true
    });
    n
}

/// Whether task `tid` of this process has ended: it is a zombie (a main
/// thread that left through pthread_exit stays listed as one until the
/// whole process ends), it is being reaped, or it is no longer listed.
pub fn has_ended(tid: u32) -> bool {
    let mut path = [0u8; 48];
    let mut digits = [0u8; 20];
    let mut n = 0;
    for part in [
        b"/proc/self/task/".as_slice(),
        crate::sys::decimal(u64::from(tid), &mut digits).as_bytes(),
        b"/stat\0",
    ] {
        path[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    // SAFETY: a NUL-terminated path in `path`.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return true;
    }
    let mut stat = [0u8; 512];
    // SAFETY: reading at most stat.len() bytes into stat.
    let len = unsafe { libc::read(fd, stat.as_mut_ptr().cast(), stat.len()) };
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    let stat = &stat[..len.max(0) as usize];
    // "tid (comm) S ...": the command may contain ')', the state follows the last.
    match stat.iter().rposition(|&b| b == b')') {
        Some(i) => matches!(stat.get(i + 2), Some(b'Z' | b'X' | b'x') | None),
        None => true,
    }
}
