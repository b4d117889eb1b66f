//! Thin wrappers over the C library: symbol lookup, membarrier, thread and
//! process ids, and raw output.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Writes all of `bytes` to `fd`, retrying on EINTR and short writes.
pub fn write_all(fd: i32, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        bytes = &bytes[n as usize..];
    }
    true
}

/// The soft limit of `resource` (`RLIM_INFINITY` when unlimited), or None
/// if it cannot be read.
pub fn soft_limit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    (unsafe { libc::getrlimit(resource, &mut limit) } == 0).then_some(limit.rlim_cur)
}

/// The kernel thread id of the calling thread.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// sigaltstack(2) itself, as glibc's wrapper makes it (-1 and errno on
/// failure): glibc's `sigaltstack` symbol is the agent's own hook.
///
/// # Safety
/// `ss` is null or points to a readable `stack_t`; `old` is null or writable.
pub unsafe fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> libc::c_int {
    // SAFETY: the system call reads `ss` and writes `old`, as the caller allows.
    unsafe { libc::syscall(libc::SYS_sigaltstack, ss, old) as libc::c_int }
}

/// An alternate signal stack setting that disables it (what a query
/// returns when the thread has none).
pub const ALTSTACK_DISABLED: libc::stack_t = libc::stack_t {
    ss_sp: core::ptr::null_mut(),
    ss_flags: libc::SS_DISABLE,
    ss_size: 0,
};

/// The process id, from the kernel (not cached: correct in fork and vfork children).
pub fn getpid_raw() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::syscall(libc::SYS_getpid) as u32 }
}

/// Makes the kernel send this process SIGKILL when `parent` (the thread of
/// it that forked us) dies, and sends it now if it died already (we were
/// then given to another parent).
pub fn die_with_parent(parent: u32) {
    // SAFETY: prctl with an integer argument; getppid and kill have no
    // preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        if libc::getppid() as u32 != parent {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Prints a diagnostic from the agent to stderr without allocating.
pub fn warn(msg: &str) {
    warn_parts(&[msg]);
}

/// What descriptor 2 was when the agent started (device, inode; both 0:
/// not open then).
static STDERR_DEV: AtomicU64 = AtomicU64::new(0);
static STDERR_INO: AtomicU64 = AtomicU64::new(0);

/// The identity of the file open on descriptor 2, if one is.
fn stderr_identity() -> Option<(u64, u64)> {
    // SAFETY: fstat fills the struct we own (all zeroes is a valid one).
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(2, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Notes what stderr is (the constructor), for `warn_parts`.
pub fn note_stderr() {
    let (dev, ino) = stderr_identity().unwrap_or((0, 0));
    STDERR_DEV.store(dev, Ordering::Relaxed);
    STDERR_INO.store(ino, Ordering::Relaxed);
}

/// `warn` of the concatenated parts, without allocating (async-signal-safe).
/// Only while descriptor 2 is still the stderr the program started with: a
/// daemon that closed it may have the number on a file or socket of its own
/// now, which must not receive the agent's words. errno is kept.
pub fn warn_parts(parts: &[&str]) {
    let known = (
        STDERR_DEV.load(Ordering::Relaxed),
        STDERR_INO.load(Ordering::Relaxed),
    );
    if known == (0, 0) || stderr_identity() != Some(known) {
        return;
    }
    // SAFETY: this thread's errno location.
    let errno = unsafe { *libc::__errno_location() };
    write_all(2, b"trapline agent: ");
    for part in parts {
        write_all(2, part.as_bytes());
    }
    write_all(2, b"\n");
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// `n` in decimal, written into `buf` (no allocation).
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    core::str::from_utf8(&buf[i..]).unwrap_or("?")
}

/// The name of the errors a trace write can meet (strerror may allocate).
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOSPC => "no space left on device",
        libc::EDQUOT => "disk quota exceeded",
        libc::EFBIG => "file too large",
        libc::EIO => "input/output error",
        libc::EBADF => "bad file descriptor",
        libc::EPIPE => "broken pipe",
        libc::EROFS => "read-only file system",
        _ => "write error",
    }
}

/// The next definition of `name` after the agent (RTLD_NEXT), or 0; for
/// an agent loaded into a running process (`look_up_globally`), the
/// definition the program's own lookups find.
pub fn next_symbol(name: &core::ffi::CStr) -> usize {
    if LOOK_UP_GLOBALLY.load(Ordering::Relaxed) {
        return defined_symbol(name);
    }
    // SAFETY: the C library's dlsym with a NUL-terminated name; may
    // allocate, which the re-entrancy guard of the calling hook (if any)
    // handles. The call is from here, so RTLD_NEXT means after the agent.
    unsafe { c_library_dlsym()(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

/// The agent library's own entry in the loader: its path (`dli_fname`)
/// and where it is mapped (`dli_fbase`); all zero if dladdr fails.
pub fn own_module() -> libc::Dl_info {
    // SAFETY: Dl_info is plain pointers and integers; all zero is valid;
    // dladdr fills it for an address inside this library.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        libc::dladdr(own_module as *const libc::c_void, &mut info);
        info
    }
}

/// Whether `f` is a function a module defines: not the PLT stub a non-PIE
/// executable exports for a function whose address it takes (an undefined
/// symbol with a value), whose calls go through the executable's own slot.
pub fn is_definition(f: usize) -> bool {
    f != 0 && loader_symbol(f as u64).is_some_and(|(_, s)| s.st_shndx != SHN_UNDEF)
}

/// The definition of `name` the program's calls are bound to, for an
/// agent loaded after the start: the global lookup's, unless that is an
/// executable's PLT stub, then the first library's that defines it.
fn defined_symbol(name: &core::ffi::CStr) -> usize {
    // SAFETY: as in `next_symbol`.
    let global = unsafe { c_library_dlsym()(libc::RTLD_DEFAULT, name.as_ptr()) as usize };
    if global == 0 || is_definition(global) {
        return global;
    }
    let own = own_module().dli_fbase as usize;
    for m in crate::platform::imports::modules().iter().skip(1) {
        let path = m.path();
        if path.to_bytes().is_empty() || m.extent().contains(&own) {
            continue;
        }
        // SAFETY: a loaded module's own path; RTLD_NOLOAD only takes a
        // reference to it, dropped below; dlsym with a NUL-terminated name.
        let f = unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if handle.is_null() {
                continue;
            }
            let f = c_library_dlsym()(handle, name.as_ptr()) as usize;
            libc::dlclose(handle);
            f
        };
        if is_definition(f) && m.extent().contains(&f) {
            return f;
        }
    }
    global
}

/// Whether the real functions are looked up in the global scope.
static LOOK_UP_GLOBALLY: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

/// For an agent a program loaded with dlopen (`trapline attach`): its own
/// scope holds only its own dependencies, so RTLD_NEXT would miss what it
/// does not link (libstdc++'s operators); the global scope, which a
/// library loaded without RTLD_GLOBAL is not part of, has the program's
/// definitions, the functions its import slots were bound to.
pub fn look_up_globally() {
    LOOK_UP_GLOBALLY.store(true, Ordering::Relaxed);
}

type DlsymFn = unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char) -> *mut libc::c_void;
static C_LIBRARY_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The C library's own `dlsym`. A program that defines `dlsym` itself (GL
/// wrappers do) would otherwise answer the agent's lookups: it forwards
/// with its own return address, so RTLD_NEXT meant "after the executable",
/// the agent's own hooks, and the agent called itself forever (sigaction in
/// its constructor). `dlvsym` by version reaches glibc's (GLIBC_2.34; before
/// that, libdl's GLIBC_2.2.5).
fn c_library_dlsym() -> DlsymFn {
    let mut f = C_LIBRARY_DLSYM.load(Ordering::Acquire);
    if f == 0 {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with NUL-terminated name and version.
            f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) }
                as usize;
            if f != 0 {
                break;
            }
        }
        if f == 0 {
            f = libc::dlsym as *const () as usize;
        }
        C_LIBRARY_DLSYM.store(f, Ordering::Release);
    }
    // SAFETY: `f` is a dlsym with its C signature.
    unsafe { core::mem::transmute::<usize, DlsymFn>(f) }
}

/// `next_symbol(name)`, looked up once and kept in `slot` (0: not yet).
/// The hooks resolve their real functions this way, in the constructor while
/// dlsym is safe, or on first use.
pub fn cached_next_symbol(slot: &AtomicUsize, name: &core::ffi::CStr) -> usize {
    let mut f = slot.load(Ordering::Acquire);
    if f == 0 {
        f = next_symbol(name);
        slot.store(f, Ordering::Release);
    }
    f
}

/// glibc's `dladdr1` request for the symbol table entry (dlfcn.h).
const RTLD_DL_SYMENT: core::ffi::c_int = 1;
pub const SHN_UNDEF: u16 = 0;

/// An ELF64 symbol table entry, as `dladdr1` points at it.
#[repr(C)]
pub struct ElfSymbol {
    pub st_name: u32,
    pub st_info: u8,
    pub st_other: u8,
    pub st_shndx: u16,
    pub st_value: u64,
    pub st_size: u64,
}

/// The loader's view of `addr` (`dladdr1`, which allocates nothing): its
/// module and nearest dynamic symbol, with that symbol's table entry.
/// Both point into the loader's data, alive while the module is loaded,
/// which the callers' use (at once) does not outlast.
pub fn loader_symbol(addr: u64) -> Option<(libc::Dl_info, &'static ElfSymbol)> {
    let mut sym: *const ElfSymbol = core::ptr::null();
    // SAFETY: dladdr1 fills the Dl_info we own and points `sym` at the
    // loader's symbol table entry (or leaves it null).
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let found = libc::dladdr1(
            addr as *const libc::c_void,
            &mut info,
            (&mut sym as *mut *const ElfSymbol).cast(),
            RTLD_DL_SYMENT,
        );
        (found != 0 && !sym.is_null()).then(|| (info, &*sym))
    }
}

/// The dynamic symbol whose code contains `addr` (within its size), by
/// name.
pub fn symbol_containing(addr: u64) -> Option<&'static core::ffi::CStr> {
    let (info, sym) = loader_symbol(addr)?;
    if info.dli_sname.is_null() || info.dli_saddr.is_null() {
        return None;
    }
    let start = info.dli_saddr as u64;
    // SAFETY: a NUL-terminated name in the loader's string table.
    (addr >= start && addr - start < sym.st_size)
        .then(|| unsafe { core::ffi::CStr::from_ptr(info.dli_sname) })
}

/// The signals a thread's own code raises when it faults: never blocked
/// in the agent's threads, and never "sent from outside".
pub const FAULT_SIGNALS: [core::ffi::c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// A path the dynamic loader owns (a module's name from `dladdr`,
/// `dl_iterate_phdr` or a link map), copied; "" for none (null).
pub fn loader_path(name: *const core::ffi::c_char) -> String {
    if name.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string owned by the loader, copied at once.
    unsafe { core::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// Any definition of `name` in the process (RTLD_DEFAULT), or 0.
pub fn any_symbol(name: &core::ffi::CStr) -> usize {
    // SAFETY: as above.
    unsafe { c_library_dlsym()(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: i32 = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: i32 = 1 << 4;

/// Whether `process_barrier` can use membarrier (Linux 4.14+).
static MEMBARRIER: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Registers the process for expedited membarrier (at start and in fork children).
pub fn membarrier_register() -> bool {
    // SAFETY: membarrier takes two integer arguments and no pointers.
    let ok = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
        )
    } == 0;
    MEMBARRIER.store(ok, Ordering::Release);
    ok
}

pub fn has_membarrier() -> bool {
    MEMBARRIER.load(Ordering::Acquire)
}

/// Makes every other running thread of the process execute a full memory
/// barrier: the heavy half of an asymmetric Dekker handshake whose light half
/// (plain stores, compiler fences) runs on every event.
pub fn process_barrier() {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
}

pub type StartRoutine = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartRoutine,
    *mut c_void,
) -> libc::c_int;

/// The C library's pthread_create (the exported name is the agent's hook).
static REAL_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);

pub fn real_pthread_create() -> PthreadCreate {
    let f = crate::platform::sys::cached_next_symbol(&REAL_PTHREAD_CREATE, c"pthread_create");
    // SAFETY: the C library's pthread_create, which has this signature (it
    // always exists: glibc 2.34+ has it in libc itself).
    unsafe { core::mem::transmute::<usize, PthreadCreate>(f) }
}

/// Starts one of the agent's own threads (the writer) without recording it.
///
/// # Safety
/// As pthread_create.
pub unsafe fn create_untraced(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: StartRoutine,
    arg: *mut c_void,
) -> libc::c_int {
    // SAFETY: forwarding the caller's arguments (the caller upholds the contract).
    unsafe { real_pthread_create()(thread, attr, routine, arg) }
}
