//! The allocator below the agent: the functions the program's calls would
//! have reached without it.
//!
//! Usually that is glibc's malloc. But a program may bring its own in a
//! shared library: linked (`-ljemalloc`, `-ltcmalloc`) or preloaded after the
//! agent (`LD_PRELOAD=libjemalloc.so.2`). The agent comes first in symbol
//! lookup, so it must pass each call on to that library, not to glibc:
//! otherwise the program silently runs on another allocator under trapline,
//! and crashes as soon as it hands one of glibc's blocks to its allocator's
//! own API (jemalloc's `sdallocx`, tcmalloc's `tc_free`).
//!
//! Each function is the next definition after the agent (`dlsym(RTLD_NEXT)`),
//! looked up independently, exactly as the dynamic loader would have bound the
//! program's own call. They are resolved together on the first call of any
//! allocation hook (which may come before the agent's constructor: other
//! libraries' initializers allocate), and the pointers never change after
//! that. A name with no definition at all falls back to an equivalent call
//! on the same allocator (`valloc` as `memalign` of a page, ...).
//!
//! A failed lookup makes dlsym allocate its error message through the hooks:
//! the lookups run with the thread's guard raised, so those calls are the
//! agent's nested ones, not the program's. A hook entered on the looking-up
//! thread before `malloc` is resolved uses glibc's own entry points
//! (`__libc_*`).

use core::ffi::{c_void, CStr};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut u8;
    fn __libc_calloc(n: usize, size: usize) -> *mut u8;
    fn __libc_realloc(ptr: *mut u8, size: usize) -> *mut u8;
    fn __libc_free(ptr: *mut u8);
    fn __libc_memalign(align: usize, size: usize) -> *mut u8;
}

const MALLOC: usize = 0;
const CALLOC: usize = 1;
const REALLOC: usize = 2;
const FREE: usize = 3;
const MEMALIGN: usize = 4;
const ALIGNED_ALLOC: usize = 5;
const POSIX_MEMALIGN: usize = 6;
const VALLOC: usize = 7;
const PVALLOC: usize = 8;
const USABLE_SIZE: usize = 9;
const FREE_SIZED: usize = 10;
const FREE_ALIGNED_SIZED: usize = 11;
const SDALLOCX: usize = 12;
const DALLOCX: usize = 13;
const MALLOCX: usize = 14;
const RALLOCX: usize = 15;
const XALLOCX: usize = 16;

const NAMES: [&CStr; 17] = [
    c"malloc",
    c"calloc",
    c"realloc",
    c"free",
    c"memalign",
    c"aligned_alloc",
    c"posix_memalign",
    c"valloc",
    c"pvalloc",
    c"malloc_usable_size",
    c"free_sized",
    c"free_aligned_sized",
    c"sdallocx",
    c"dallocx",
    c"mallocx",
    c"rallocx",
    c"xallocx",
];

/// Makes `name`'s calls go to `f` (a detoured allocator's trampoline):
/// false when `name` is not an allocation function of the table.
pub fn set_next(name: &CStr, f: usize) -> bool {
    match NAMES.iter().position(|n| *n == name) {
        Some(i) => {
            NEXT[i].store(f, Ordering::Release);
            SET_BY_DETOUR.fetch_or(1 << i, Ordering::AcqRel);
            true
        }
        None => false,
    }
}

/// The functions `set_next` gave: the lookup leaves them alone.
static SET_BY_DETOUR: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// The allocation functions' names.
pub fn names() -> &'static [&'static CStr] {
    &NAMES
}

/// The resolved functions; 0 before the lookup, or where no definition exists.
static NEXT: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

const PAGE: usize = 4096;

/// Looks the functions up. Called by the first allocation hook, and by the
/// constructor. Threads that find nothing resolved yet all look up (the
/// answers are the same); a call re-entered on the thread that is looking up
/// (a free inside dlsym) gets 0 and uses glibc's entry point.
#[cold]
#[inline(never)]
pub fn resolve() {
    let me = crate::platform::sys::gettid() as usize;
    let claimed = RESOLVER
        .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_ok();
    if !claimed && RESOLVER.load(Ordering::Relaxed) == me {
        return;
    }
    // A lookup that fails (a name no library defines) makes dlsym allocate
    // its error message, through the hooks: as nested calls of the agent's,
    // those are not recorded as the program's.
    let ts = crate::events::thread::current_without_allocating();
    ts.guard += 1;
    // C23's and jemalloc's own functions only where malloc is not glibc's:
    // for glibc, free_sized is free (and the lookup fails before glibc
    // 2.41); a failed lookup makes dlsym allocate its message from the
    // program's heap, and the freed chunks changed where the program's
    // first blocks went.
    let standard = NEXT.iter().zip(NAMES).take(FREE_SIZED);
    let others = NEXT.iter().zip(NAMES).skip(FREE_SIZED);
    let detoured = SET_BY_DETOUR.load(Ordering::Acquire);
    for (i, (next, name)) in standard.enumerate() {
        if detoured & (1 << i) == 0 {
            next.store(crate::platform::sys::next_symbol(name), Ordering::Relaxed);
        }
    }
    let malloc = NEXT[MALLOC].load(Ordering::Relaxed);
    let library = library_of(malloc);
    if library.is_some() {
        for (i, (next, name)) in others.enumerate() {
            if detoured & (1 << (i + FREE_SIZED)) == 0 {
                next.store(crate::platform::sys::next_symbol(name), Ordering::Relaxed);
            }
        }
        crate::tracking::allocator_maps::set_allocator(crate::capture::modules::extent_of(
            malloc as u64,
        ));
    } else if detoured == 0 {
        // (A detoured allocator in the executable has set its own.)
        crate::tracking::allocator_maps::set_allocator(None);
    }
    let _ = LIBRARY.set(library);
    // A failed lookup (C23's free_sized before glibc 2.41) leaves its
    // message for the program's next dlerror(): take it.
    // SAFETY: dlerror only reads and frees this thread's error state.
    unsafe { libc::dlerror() };
    ts.guard -= 1;
    RESOLVED.store(true, Ordering::Release);
    if claimed {
        RESOLVER.store(0, Ordering::Release);
    }
}

/// The thread inside `resolve` that claimed it, or 0.
static RESOLVER: AtomicUsize = AtomicUsize::new(0);
static RESOLVED: AtomicBool = AtomicBool::new(false);
/// `library_of` the resolved `malloc`, as `resolve` found it (a fork child
/// inherits it).
static LIBRARY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The next definition of function `i`, or 0 when there is none (or while
/// this thread is looking it up).
#[inline(always)]
fn next(i: usize) -> usize {
    let f = NEXT[i].load(Ordering::Relaxed);
    if f != 0 {
        return f;
    }
    next_slow(i)
}

#[cold]
#[inline(never)]
fn next_slow(i: usize) -> usize {
    if !RESOLVED.load(Ordering::Acquire) {
        resolve();
    }
    NEXT[i].load(Ordering::Relaxed)
}

/// Calls function pointer `f` (nonzero) with the C signature given.
macro_rules! call {
    ($f:expr, fn($($t:ty),*) -> $r:ty, $($a:expr),*) => {{
        // SAFETY: `f` is the definition the dynamic loader would have bound
        // the program's call to, with the C signature of the function it is
        // named for.
        let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { core::mem::transmute($f) };
        // SAFETY: the caller's arguments passed through unchanged.
        unsafe { f($($a),*) }
    }};
}

#[inline(always)]
pub fn malloc(size: usize) -> *mut u8 {
    let f = next(MALLOC);
    if f == 0 {
        // SAFETY: glibc's malloc, any size.
        return unsafe { __libc_malloc(size) };
    }
    call!(f, fn(usize) -> *mut u8, size)
}

#[inline(always)]
pub fn calloc(n: usize, size: usize) -> *mut u8 {
    let f = next(CALLOC);
    if f == 0 {
        // SAFETY: glibc's calloc checks n*size for overflow.
        return unsafe { __libc_calloc(n, size) };
    }
    call!(f, fn(usize, usize) -> *mut u8, n, size)
}

/// # Safety
/// `ptr` is NULL or a live block of this allocator.
#[inline(always)]
pub unsafe fn realloc(ptr: *mut u8, size: usize) -> *mut u8 {
    let f = next(REALLOC);
    if f == 0 {
        // SAFETY: as the caller promises.
        return unsafe { __libc_realloc(ptr, size) };
    }
    call!(f, fn(*mut u8, usize) -> *mut u8, ptr, size)
}

/// # Safety
/// `ptr` is NULL or a live block of this allocator.
#[inline(always)]
pub unsafe fn free(ptr: *mut u8) {
    let f = next(FREE);
    if f == 0 {
        // SAFETY: as the caller promises.
        return unsafe { __libc_free(ptr) };
    }
    call!(f, fn(*mut u8) -> (), ptr)
}

#[inline(always)]
pub fn memalign(align: usize, size: usize) -> *mut u8 {
    let f = next(MEMALIGN);
    if f == 0 {
        // SAFETY: glibc's memalign takes any alignment and size.
        return unsafe { __libc_memalign(align, size) };
    }
    call!(f, fn(usize, usize) -> *mut u8, align, size)
}

pub fn aligned_alloc(align: usize, size: usize) -> *mut u8 {
    let f = next(ALIGNED_ALLOC);
    if f == 0 {
        return memalign(align, size);
    }
    call!(f, fn(usize, usize) -> *mut u8, align, size)
}

/// posix_memalign's return code, and the block (NULL on failure).
pub fn posix_memalign(align: usize, size: usize) -> (i32, *mut u8) {
    let f = next(POSIX_MEMALIGN);
    if f == 0 {
        if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<usize>()) {
            return (libc::EINVAL, core::ptr::null_mut());
        }
        let p = memalign(align, size);
        return (if p.is_null() { libc::ENOMEM } else { 0 }, p);
    }
    let mut out: *mut u8 = core::ptr::null_mut();
    let out_ptr: *mut *mut u8 = &mut out;
    let rc = call!(
        f,
        fn(*mut *mut u8, usize, usize) -> i32,
        out_ptr,
        align,
        size
    );
    (rc, if rc == 0 { out } else { core::ptr::null_mut() })
}

pub fn valloc(size: usize) -> *mut u8 {
    let f = next(VALLOC);
    if f == 0 {
        return memalign(PAGE, size);
    }
    call!(f, fn(usize) -> *mut u8, size)
}

pub fn pvalloc(size: usize) -> *mut u8 {
    let f = next(PVALLOC);
    if f == 0 {
        return memalign(PAGE, pvalloc_size(size));
    }
    call!(f, fn(usize) -> *mut u8, size)
}

/// The size pvalloc hands out: whole pages, at least one.
pub fn pvalloc_size(size: usize) -> usize {
    (size.saturating_add(PAGE - 1) & !(PAGE - 1)).max(PAGE)
}

/// # Safety
/// `ptr` is NULL or a live block of this allocator.
pub unsafe fn usable_size(ptr: *mut u8) -> usize {
    let f = next(USABLE_SIZE);
    if f == 0 {
        return 0;
    }
    call!(f, fn(*mut u8) -> usize, ptr)
}

/// C23's sized release (glibc 2.41); `free` when no library defines it
/// (the agent defines the symbol, so a program that probes for it finds one).
///
/// # Safety
/// `ptr` is NULL or a live block of this allocator.
pub unsafe fn free_sized(ptr: *mut u8, size: usize) {
    let f = next(FREE_SIZED);
    if f == 0 {
        // SAFETY: as the caller promises.
        return unsafe { free(ptr) };
    }
    call!(f, fn(*mut u8, usize) -> (), ptr, size)
}

/// C23's sized release of an aligned block; `free` when no library defines it.
///
/// # Safety
/// `ptr` is NULL or a live block of this allocator.
pub unsafe fn free_aligned_sized(ptr: *mut u8, align: usize, size: usize) {
    let f = next(FREE_ALIGNED_SIZED);
    if f == 0 {
        // SAFETY: as the caller promises.
        return unsafe { free(ptr) };
    }
    call!(f, fn(*mut u8, usize, usize) -> (), ptr, align, size)
}

/// jemalloc's sized release; `free` when no library defines it (the agent
/// defines the symbol, so a program that probes for it finds one).
///
/// # Safety
/// `ptr` is a live block of this allocator.
pub unsafe fn sdallocx(ptr: *mut u8, size: usize, flags: i32) {
    let f = next(SDALLOCX);
    if f == 0 {
        // SAFETY: as the caller promises.
        return unsafe { free(ptr) };
    }
    call!(f, fn(*mut u8, usize, i32) -> (), ptr, size, flags)
}

/// jemalloc's release with flags; `free` when no library defines it.
///
/// # Safety
/// `ptr` is a live block of this allocator.
pub unsafe fn dallocx(ptr: *mut u8, flags: i32) {
    let f = next(DALLOCX);
    if f == 0 {
        // SAFETY: as the caller promises.
        return unsafe { free(ptr) };
    }
    call!(f, fn(*mut u8, i32) -> (), ptr, flags)
}

/// jemalloc's `MALLOCX_ZERO` flag: the new bytes are zeroed.
const MALLOCX_ZERO: i32 = 0x40;

/// The alignment jemalloc's flags ask for (`MALLOCX_LG_ALIGN`: log2 in the
/// low six bits), or 0 for the default.
pub fn mallocx_align(flags: i32) -> usize {
    match flags & 0x3f {
        0 => 0,
        lg => 1usize.checked_shl(lg as u32).unwrap_or(0),
    }
}

/// jemalloc's allocation with flags. Without jemalloc (a program that found
/// the agent's `mallocx` through a weak reference): `malloc` or `memalign`,
/// zeroed if the flags ask.
pub fn mallocx(size: usize, flags: i32) -> *mut u8 {
    let f = next(MALLOCX);
    if f != 0 {
        return call!(f, fn(usize, i32) -> *mut u8, size, flags);
    }
    let p = match mallocx_align(flags) {
        0 => malloc(size),
        align => memalign(align, size),
    };
    if !p.is_null() && flags & MALLOCX_ZERO != 0 {
        // SAFETY: a new block of at least `size` bytes.
        unsafe { core::ptr::write_bytes(p, 0, size) };
    }
    p
}

/// jemalloc's reallocation with flags; NULL means it failed and `ptr` is
/// untouched. Without jemalloc: `realloc`, or a new aligned block and a copy
/// when the flags ask for more alignment than malloc's, zeroing what grew
/// if asked.
///
/// # Safety
/// `ptr` is a live block of this allocator.
pub unsafe fn rallocx(ptr: *mut u8, size: usize, flags: i32) -> *mut u8 {
    let f = next(RALLOCX);
    if f != 0 {
        return call!(f, fn(*mut u8, usize, i32) -> *mut u8, ptr, size, flags);
    }
    // SAFETY: `ptr` is live, as the caller promises.
    let old = unsafe { usable_size(ptr) };
    let align = mallocx_align(flags);
    let p = if align > 16 {
        let p = memalign(align, size);
        if !p.is_null() {
            // SAFETY: both blocks are live and at least this long.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, p, old.min(size));
                free(ptr);
            }
        }
        p
    } else {
        // SAFETY: as the caller promises.
        unsafe { realloc(ptr, size) }
    };
    if !p.is_null() && flags & MALLOCX_ZERO != 0 && size > old {
        // SAFETY: the block holds `size` bytes; those past `old` are new.
        unsafe { core::ptr::write_bytes(p.add(old), 0, size - old) };
    }
    p
}

/// jemalloc's resize in place: the block's real size afterwards (less than
/// `size` when it could not grow). Without jemalloc nothing can grow in
/// place: the usable size, unchanged.
///
/// # Safety
/// `ptr` is a live block of this allocator.
pub unsafe fn xallocx(ptr: *mut u8, size: usize, extra: usize, flags: i32) -> usize {
    let f = next(XALLOCX);
    if f != 0 {
        return call!(
            f,
            fn(*mut u8, usize, usize, i32) -> usize,
            ptr,
            size,
            extra,
            flags
        );
    }
    // SAFETY: as the caller promises.
    unsafe { usable_size(ptr) }
}

/// glibc's `struct dl_find_object` (2.35 and later; x86_64 has no
/// `dlfo_eh_dbase`).
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 7],
}

/// The start of the C library's `struct link_map`.
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const core::ffi::c_char,
}

/// An identity of the module that holds `addr` (its link map, or where an
/// older C library lacks `_dl_find_object`, its load address) and its path
/// ("" for the executable).
pub(crate) fn module_of(addr: usize) -> Option<(usize, String)> {
    if addr == 0 {
        return None;
    }
    // `_dl_find_object` looks the address up in a sorted table; `dladdr`
    // also searches the module's symbols for the nearest one, which took
    // about 70 microseconds per call in the C library, twice per process
    // image at start and twice more for its trace's header.
    let find = crate::platform::sys::any_symbol(c"_dl_find_object");
    if find != 0 {
        // SAFETY: glibc's `int _dl_find_object(void *, struct dl_find_object *)`.
        let find: unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> i32 =
            unsafe { core::mem::transmute(find) };
        // SAFETY: plain data: all zeroes is valid.
        let mut found: DlFindObject = unsafe { core::mem::zeroed() };
        // SAFETY: `found` is ours and as large as glibc's structure.
        if unsafe { find(addr as *mut c_void, &mut found) } != 0 || found.link_map.is_null() {
            return None;
        }
        // SAFETY: a loaded module's link map, which starts with these fields.
        let head = unsafe { &*(found.link_map as *const LinkMapHead) };
        return Some((
            found.link_map as usize,
            crate::platform::sys::loader_path(head.l_name),
        ));
    }
    // SAFETY: Dl_info is plain data (pointers and integers): all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr fills the Dl_info we own; the name is copied at once.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return None;
    }
    Some((
        info.dli_fbase as usize,
        crate::platform::sys::loader_path(info.dli_fname),
    ))
}

/// The path of the shared library whose `malloc` the calls go to, when it is
/// not the C library's (told apart by the module that holds
/// `gnu_get_libc_version`, which only glibc defines). For the trace: blocks
/// that library releases through its own functions are not seen.
pub fn library() -> Option<String> {
    match LIBRARY.get() {
        Some(library) => library.clone(),
        None => library_of(next(MALLOC)),
    }
}

/// The path of the module holding `malloc`, unless it is the C library.
fn library_of(malloc: usize) -> Option<String> {
    let glibc = crate::platform::sys::any_symbol(c"gnu_get_libc_version");
    let (module, path) = module_of(malloc)?;
    (module_of(glibc).map(|(m, _)| m) != Some(module)).then_some(path)
}
