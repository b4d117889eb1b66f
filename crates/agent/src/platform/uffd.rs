//! userfaultfd(2): the kernel's way to let a thread of ours serve the page
//! faults of chosen pages. The access monitor (tracking::access) takes a
//! page away and gives it back at its first access, so this is only the
//! system calls and the kernel's structures (linux/userfaultfd.h; the ioctl
//! numbers are the generic `_IOC` encoding, the same on x86-64 and aarch64).

const UFFD_API: u64 = 0xAA;
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const READ: u64 = 2;
const READ_WRITE: u64 = 3;

#[repr(C)]
#[derive(Default)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct Copy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copied: i64,
}

#[repr(C)]
#[derive(Default)]
struct ZeroPage {
    range: Range,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct WriteProtect {
    range: Range,
    mode: u64,
}

const IOC_API: u64 = ioc(READ_WRITE, 0x3F, size_of::<Api>());
const IOC_REGISTER: u64 = ioc(READ_WRITE, 0x00, size_of::<Register>());
const IOC_UNREGISTER: u64 = ioc(READ, 0x01, size_of::<Range>());
const IOC_WAKE: u64 = ioc(READ, 0x02, size_of::<Range>());
const IOC_COPY: u64 = ioc(READ_WRITE, 0x03, size_of::<Copy>());
const IOC_ZEROPAGE: u64 = ioc(READ_WRITE, 0x04, size_of::<ZeroPage>());
const IOC_WRITEPROTECT: u64 = ioc(READ_WRITE, 0x06, size_of::<WriteProtect>());
/// /dev/userfaultfd's one request: a new userfaultfd.
const IOC_NEW: u64 = 0xAA00;

const MODE_MISSING: u64 = 1;
const MODE_WP: u64 = 2;

pub const FEATURE_THREAD_ID: u64 = 1 << 8;
/// A fault's address is the byte accessed, not its page (Linux 5.18).
pub const FEATURE_EXACT_ADDRESS: u64 = 1 << 11;

pub const EVENT_PAGEFAULT: u8 = 0x12;

/// One message read from a userfaultfd (`struct uffd_msg`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Message {
    pub event: u8,
    _reserved: [u8; 7],
    /// Page fault: flags; remove and unmap: the range's start.
    pub arg0: u64,
    /// Page fault: the address (the byte's with FEATURE_EXACT_ADDRESS, else
    /// its page's); remove and unmap: the range's end.
    pub arg1: u64,
    /// Page fault: the faulting thread's id (FEATURE_THREAD_ID).
    pub arg2: u64,
}

/// A userfaultfd of this process, closed when dropped.
pub struct Uffd(pub i32);

fn ioctl<T>(fd: i32, request: u64, arg: &mut T) -> Result<(), i32> {
    // SAFETY: `arg` is the structure `request` reads and writes.
    let r = unsafe { libc::ioctl(fd, request as libc::c_ulong, core::ptr::from_mut(arg)) };
    if r == 0 {
        Ok(())
    } else {
        // SAFETY: errno is this thread's.
        Err(unsafe { *libc::__errno_location() })
    }
}

impl Uffd {
    /// A userfaultfd whose faults include the kernel's own accesses (a
    /// read(2) into a watched buffer waits for us instead of failing), with
    /// the thread ids and removal events `features` asks for. Tried through
    /// the system call, then /dev/userfaultfd (which unprivileged users may
    /// be given); the error says which was refused.
    pub fn open(features: u64) -> Result<Uffd, &'static str> {
        // SAFETY: a plain system call; the descriptor is ours.
        let mut fd = unsafe {
            libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as i32
        };
        if fd < 0 {
            // SAFETY: opening a device read-write; its one ioctl takes flags.
            unsafe {
                let dev = libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                if dev >= 0 {
                    fd = libc::ioctl(
                        dev,
                        IOC_NEW as libc::c_ulong,
                        libc::O_CLOEXEC | libc::O_NONBLOCK,
                    );
                    libc::close(dev);
                }
            }
        }
        if fd < 0 {
            return Err("userfaultfd is not allowed here (as root, or with vm.unprivileged_userfaultfd=1, or access to /dev/userfaultfd)");
        }
        let uffd = Uffd(fd);
        let mut api = Api {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        ioctl(fd, IOC_API, &mut api)
            .map_err(|_| "userfaultfd lacks thread ids or removal events")?;
        Ok(uffd)
    }

    /// Registers one range for missing-page and write-protect faults.
    pub fn register(&self, start: u64, len: u64) -> Result<(), i32> {
        let mut r = Register {
            range: Range { start, len },
            mode: MODE_MISSING | MODE_WP,
            ioctls: 0,
        };
        ioctl(self.0, IOC_REGISTER, &mut r)
    }

    /// Unregisters a range (threads waiting in it are woken).
    pub fn unregister(&self, start: u64, len: u64) -> Result<(), i32> {
        let mut r = Range { start, len };
        ioctl(self.0, IOC_UNREGISTER, &mut r)
    }

    /// Write-protects a registered range (writers then wait for us), or
    /// lifts the protection.
    pub fn write_protect(&self, start: u64, len: u64, on: bool) -> Result<(), i32> {
        let mut w = WriteProtect {
            range: Range { start, len },
            mode: u64::from(on),
        };
        ioctl(self.0, IOC_WRITEPROTECT, &mut w)
    }

    /// Fills the missing pages of `[dst, dst+len)` from `src` and wakes the
    /// threads waiting there. A page already there is EEXIST.
    pub fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), i32> {
        let mut c = Copy {
            dst,
            src,
            len,
            mode: 0,
            copied: 0,
        };
        ioctl(self.0, IOC_COPY, &mut c)
    }

    /// Fills a missing range with zeros and wakes its waiters.
    pub fn zero(&self, start: u64, len: u64) -> Result<(), i32> {
        let mut z = ZeroPage {
            range: Range { start, len },
            mode: 0,
            zeropage: 0,
        };
        ioctl(self.0, IOC_ZEROPAGE, &mut z)
    }

    /// Wakes the threads waiting on a range.
    pub fn wake(&self, start: u64, len: u64) -> Result<(), i32> {
        let mut r = Range { start, len };
        ioctl(self.0, IOC_WAKE, &mut r)
    }

    /// Waits up to `timeout_ms` for a message (None: none, or the
    /// descriptor is closed).
    pub fn next_message(&self, timeout_ms: i32) -> Option<Message> {
        let mut p = libc::pollfd {
            fd: self.0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one descriptor of ours.
        if unsafe { libc::poll(&mut p, 1, timeout_ms) } <= 0 {
            return None;
        }
        let mut m = Message::default();
        // SAFETY: reading one message into a structure of its size.
        let n = unsafe {
            libc::read(
                self.0,
                core::ptr::from_mut(&mut m).cast(),
                size_of::<Message>(),
            )
        };
        (n == size_of::<Message>() as isize).then_some(m)
    }
}

impl Drop for Uffd {
    fn drop(&mut self) {
        // SAFETY: our descriptor.
        unsafe { libc::close(self.0) };
    }
}
