//! The interposed functions. Each is exported under the C library's (or the
//! C++ runtime's) symbol name; because the agent is preloaded, the dynamic
//! linker binds every call in the program and its libraries to these first.

pub mod alloc;
pub mod attach;
pub mod context;
pub mod cxx;
pub mod eintr;
pub mod exit;
pub mod fds;
pub mod maps;
pub mod namespaces;
pub mod process;
pub mod replaced_operators;
pub mod sigmask;
pub mod signals;
pub mod sync;
pub mod threads;

/// Looks up the real functions the hooks forward to, from the constructor
/// while dlsym is safe (the lock hooks look theirs up on first use, one
/// word per call site: `real!` in hooks/sync.rs).
pub fn resolve() {
    process::resolve();
    exit::resolve();
    threads::resolve();
    context::resolve();
    sigmask::resolve();
    fds::resolve();
    eintr::resolve();
    eintr::ipc::resolve();
}
