//! The process's threads as the kernel lists them in /proc/self/task, read
//! without allocating (the scan reads them while other threads are stopped,
//! possibly holding the agent heap's lock).

/// How many times `list` reads the directory before it gives up waiting for
/// a listing the kernel's thread count confirms.
const LIST_ATTEMPTS: u32 = 64;

/// What `list` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listing {
    /// Tids written to the front of `out`.
    pub len: usize,
    /// The listing holds every task: its length matched the kernel's count
    /// read before and after it, and the listing before it held the same
    /// tasks. Otherwise it is the last attempt's, which may miss a task (or
    /// `out` was too small).
    pub settled: bool,
}

/// The process's threads that have not ended, from a settled listing
/// (None: the listing did not settle, or the kernel's count is unknown).
/// Allocates: not from a signal handler.
pub fn live_threads() -> Option<Vec<u32>> {
    let mut tids = vec![0u32; kernel_count()? as usize + 64];
    let listing = list(&mut [0u8; 4096], &mut tids);
    if !listing.settled {
        return None;
    }
    tids.truncate(listing.len);
    tids.retain(|&tid| !has_ended(tid));
    Some(tids)
}

/// Lists the tids of the process's tasks into `out`; `dirents` receives
/// the directory entries (getdents64), without allocating.
///
/// The kernel does not list /proc/self/task atomically: a read resumes by
/// position, so a task that ends while the directory is read shifts the
/// ones after it, and a live task can be left out (5 listings in 6,000 on
/// a 2-vCPU host, while 60 threads started and ended). The exit's freeres
/// then ran beside a thread it believed gone, and the scan did not stop a
/// thread it never saw. So a listing counts only when its length matches
/// the kernel's thread count, which is exact, read before and after it,
/// and when the listing before it held the same tasks: a thread started
/// meanwhile can make up for one missed in the count (1 in 6,000 listings
/// under that churn on a loaded host), not in two listings alike.
pub fn list(dirents: &mut [u8], out: &mut [u32]) -> Listing {
    let mut last = Listing {
        len: 0,
        settled: false,
    };
    let mut previous = None;
    for _ in 0..LIST_ATTEMPTS {
        let before = kernel_count();
        let (len, complete) = list_once(dirents, out);
        let after = kernel_count();
        let counted = complete && before.is_some() && before == after && before == Some(len as u32);
        let identity = (len, set_hash(&out[..len]));
        last = Listing {
            len,
            settled: counted && previous == Some(identity),
        };
        if last.settled || before.is_none() {
            break;
        }
        previous = counted.then_some(identity);
    }
    last
}

/// A hash of a set of tids, whatever their order.
fn set_hash(tids: &[u32]) -> u64 {
    tids.iter().fold(0u64, |h, &t| {
        // splitmix64's finaliser: each tid's bits spread over the word.
        let mut z = u64::from(t).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h.wrapping_add(z ^ (z >> 31))
    })
}

/// One read of the directory: how many tids went into `out`, and whether
/// all of them fitted.
fn list_once(dirents: &mut [u8], out: &mut [u32]) -> (usize, bool) {
    // SAFETY: opening a directory read-only with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return (0, false);
    }
    let mut len = 0;
    let mut complete = true;
    loop {
        // SAFETY: getdents64 writes at most dirents.len() bytes into dirents.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                dirents.as_mut_ptr(),
                dirents.len(),
            )
        };
        if n < 0 {
            complete = false;
        }
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            let reclen = u16::from_ne_bytes([dirents[off + 16], dirents[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            if let Some(tid) = parse_tid(&dirents[off + 19..off + reclen]) {
                match out.get_mut(len) {
                    Some(slot) => {
                        *slot = tid;
                        len += 1;
                    }
                    None => complete = false,
                }
            }
            off += reclen;
        }
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    (len, complete)
}

/// The tid a directory entry's NUL-terminated name spells (none for `.`
/// and `..`).
fn parse_tid(name: &[u8]) -> Option<u32> {
    let digits = name.iter().take_while(|b| b.is_ascii_digit());
    let mut tid: Option<u32> = None;
    for d in digits {
        tid = Some(
            tid.unwrap_or(0)
                .wrapping_mul(10)
                .wrapping_add(u32::from(d - b'0')),
        );
    }
    tid
}

/// The kernel's count of the process's threads (`num_threads` in
/// /proc/self/stat): it includes a main thread that left through
/// pthread_exit, and drops an ending thread when it is unlisted.
pub fn kernel_count() -> Option<u32> {
    let mut stat = [0u8; 1024];
    let stat = read_stat(c"/proc/self/stat", &mut stat)?;
    // "pid (comm) state ppid ...": num_threads is the 20th field, the 18th
    // after the command (which may contain ')' and spaces).
    let after = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let field = after
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(17)?;
    core::str::from_utf8(field).ok()?.parse().ok()
}

/// Reads a /proc stat file into `buf` without allocating.
fn read_stat<'a>(path: &core::ffi::CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: reading at most buf.len() bytes into buf.
    let len = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    (len > 0).then(|| &buf[..len as usize])
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
        crate::platform::sys::decimal(u64::from(tid), &mut digits).as_bytes(),
        b"/stat\0",
    ] {
        path[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    let Ok(path) = core::ffi::CStr::from_bytes_with_nul(&path[..n]) else {
        return true;
    };
    let mut stat = [0u8; 512];
    let Some(stat) = read_stat(path, &mut stat) else {
        return true;
    };
    // "tid (comm) S ...": the command may contain ')', the state follows the last.
    match stat.iter().rposition(|&b| b == b')') {
        Some(i) => matches!(stat.get(i + 2), Some(b'Z' | b'X' | b'x') | None),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel_count, list};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn gettid() -> u32 {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as u32 }
    }

    /// A thread kept alive by the test is in every settled listing while
    /// 60 others start and end around it. The plain directory read left it
    /// out of about 1 listing in 600 on a 2-vCPU host, and a listing the
    /// count alone confirmed 1 in 6,000 on a loaded one; the test makes
    /// 6,000.
    #[test]
    fn a_settled_listing_never_misses_a_live_thread_while_others_end() {
        let stop = Arc::new(AtomicBool::new(false));
        // Each sentinel sends its tid and a channel whose sender, dropped
        // by the lister, lets it end: it is alive while it is listed.
        let (sentinels_tx, sentinels) = std::sync::mpsc::channel();
        let churn = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let early: Vec<_> = (0..40).map(|_| std::thread::spawn(|| {})).collect();
                    // The sentinel starts after 40 threads and before 20
                    // more, so that ending threads precede it in the list.
                    let to_lister = sentinels_tx.clone();
                    let sentinel = std::thread::spawn(move || {
                        let (release_tx, release) = std::sync::mpsc::channel::<()>();
                        if to_lister.send((gettid(), release_tx)).is_ok() {
                            let _ = release.recv();
                        }
                    });
                    let late: Vec<_> = (0..20).map(|_| std::thread::spawn(|| {})).collect();
                    early
                        .into_iter()
                        .chain(late)
                        .for_each(|t| t.join().unwrap());
                    sentinel.join().unwrap();
                }
            })
        };
        let (mut settled, mut missed) = (0, 0);
        let mut dirents = [0u8; 4096];
        let mut tids = vec![0u32; 1024];
        for _ in 0..2000 {
            let (sentinel, release) = sentinels.recv().unwrap();
            for _ in 0..3 {
                let listing = list(&mut dirents, &mut tids);
                if listing.settled {
                    settled += 1;
                    missed += usize::from(!tids[..listing.len].contains(&sentinel));
                }
            }
            drop(release);
        }
        stop.store(true, Ordering::Release);
        drop(sentinels);
        churn.join().unwrap();
        assert_eq!(missed, 0, "of {settled} settled listings");
        assert!(settled > 0);
    }

    #[test]
    fn a_listing_holds_the_threads_alive_and_says_when_it_does_not_fit() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            tid_tx.send(gettid()).unwrap();
            rx.recv()
        });
        let other = tid_rx.recv().unwrap();
        assert!(kernel_count().unwrap() >= 2);
        let mut tids = vec![0u32; 1024];
        let listing = list(&mut [0u8; 256], &mut tids);
        assert!(listing.settled);
        let listed = &tids[..listing.len];
        assert!(listed.contains(&gettid()) && listed.contains(&other));
        let listing = list(&mut [0u8; 256], &mut tids[..1]);
        assert_eq!((listing.len, listing.settled), (1, false));
        drop(tx);
        let _ = t.join();
    }
}
