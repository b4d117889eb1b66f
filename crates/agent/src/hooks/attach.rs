//! The entry point `trapline attach` calls once it has loaded the library
//! into a running process, and the functions whose import slots it points
//! at their hooks (runtime/attach.rs).

use core::ffi::{c_char, c_int, CStr};

/// The trapped functions: allocation (C, C++ and jemalloc's), locks and
/// threads, and the calls that end or replace the process image, load
/// modules or close the agent's descriptors. Left out: the signal and
/// interrupted-call hooks, which exist for the agent's own signals (an
/// attached agent sends none), and `__libc_start_main`, long past.
const TRAPPED: &[&CStr] = &[
    c"malloc",
    c"calloc",
    c"realloc",
    c"reallocarray",
    c"free",
    c"posix_memalign",
    c"aligned_alloc",
    c"memalign",
    c"valloc",
    c"pvalloc",
    c"malloc_usable_size",
    c"free_sized",
    c"free_aligned_sized",
    c"mallocx",
    c"rallocx",
    c"xallocx",
    c"sdallocx",
    c"dallocx",
    c"_Znwm",
    c"_ZnwmRKSt9nothrow_t",
    c"_ZnwmSt11align_val_t",
    c"_ZnwmSt11align_val_tRKSt9nothrow_t",
    c"_Znam",
    c"_ZnamRKSt9nothrow_t",
    c"_ZnamSt11align_val_t",
    c"_ZnamSt11align_val_tRKSt9nothrow_t",
    c"_ZdlPv",
    c"_ZdlPvRKSt9nothrow_t",
    c"_ZdlPvSt11align_val_t",
    c"_ZdlPvSt11align_val_tRKSt9nothrow_t",
    c"_ZdlPvm",
    c"_ZdlPvmSt11align_val_t",
    c"_ZdaPv",
    c"_ZdaPvRKSt9nothrow_t",
    c"_ZdaPvSt11align_val_t",
    c"_ZdaPvSt11align_val_tRKSt9nothrow_t",
    c"_ZdaPvm",
    c"_ZdaPvmSt11align_val_t",
    c"pthread_mutex_init",
    c"pthread_mutex_destroy",
    c"pthread_mutex_lock",
    c"pthread_mutex_trylock",
    c"pthread_mutex_timedlock",
    c"pthread_mutex_clocklock",
    c"pthread_mutex_unlock",
    c"pthread_rwlock_init",
    c"pthread_rwlock_destroy",
    c"pthread_rwlock_rdlock",
    c"pthread_rwlock_tryrdlock",
    c"pthread_rwlock_timedrdlock",
    c"pthread_rwlock_clockrdlock",
    c"pthread_rwlock_wrlock",
    c"pthread_rwlock_trywrlock",
    c"pthread_rwlock_timedwrlock",
    c"pthread_rwlock_clockwrlock",
    c"pthread_rwlock_unlock",
    c"pthread_spin_lock",
    c"pthread_spin_trylock",
    c"pthread_spin_unlock",
    c"pthread_cond_wait",
    c"pthread_cond_timedwait",
    c"pthread_cond_clockwait",
    c"pthread_create",
    c"pthread_join",
    c"pthread_detach",
    c"pthread_exit",
    c"fork",
    c"_Fork",
    c"exit",
    c"_exit",
    c"_Exit",
    c"quick_exit",
    c"execl",
    c"execle",
    c"execlp",
    c"execv",
    c"execve",
    c"execveat",
    c"execvp",
    c"execvpe",
    c"fexecve",
    c"posix_spawn",
    c"posix_spawnp",
    c"dlopen",
    c"dlclose",
    c"close",
    c"close_range",
    c"closefrom",
    c"dup2",
    c"dup3",
];

/// The agent's own definition of each trapped function.
pub fn own_hooks() -> Vec<(&'static CStr, usize)> {
    let info = crate::platform::sys::own_module();
    // SAFETY: the handle of an object already loaded (RTLD_NOLOAD), whose
    // path the loader gave, is looked up in it and its dependencies, the
    // agent first.
    unsafe {
        let own = libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if own.is_null() {
            return Vec::new();
        }
        let hooks = TRAPPED
            .iter()
            .filter_map(|&name| {
                let f = libc::dlsym(own, name.as_ptr()) as usize;
                let mut at: libc::Dl_info = core::mem::zeroed();
                let ours = f != 0
                    && libc::dladdr(f as *const libc::c_void, &mut at) != 0
                    && at.dli_fbase == info.dli_fbase;
                ours.then_some((name, f))
            })
            .collect();
        // The reference dlopen took is dropped: the library stays, loaded
        // by the CLI's own dlopen.
        libc::dlclose(own);
        hooks
    }
}

/// `trapline attach`'s entry point: starts recording with `options`
/// (`NAME=value` lines) and points the program's import slots at the
/// hooks. 0 on success, else -1 with the reason in `error` (NUL-ended,
/// cut to `error_len`).
///
/// # Safety
/// `options` is a NUL-terminated string; `error` has room for `error_len`
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn trapline_attach(
    options: *const c_char,
    error: *mut c_char,
    error_len: usize,
) -> c_int {
    // SAFETY: the caller's NUL-terminated options.
    let options = unsafe { CStr::from_ptr(options) }.to_string_lossy();
    match crate::runtime::attach::attach(&options, super::resolve, &own_hooks()) {
        Ok(_) => 0,
        Err(why) => {
            let n = why.len().min(error_len.saturating_sub(1));
            if error_len > 0 {
                // SAFETY: `error` has room for `error_len` bytes (the
                // caller's contract); n + 1 <= error_len.
                unsafe {
                    core::ptr::copy_nonoverlapping(why.as_ptr(), error as *mut u8, n);
                    *error.add(n) = 0;
                }
            }
            -1
        }
    }
}
