//! An allocator linked into the executable (jemalloc, tcmalloc or mimalloc
//! built in, as `libjemalloc.a`): every module's `malloc` binds to the
//! executable's definition, ahead of the preloaded agent, so no import slot
//! or symbol reaches the agent. Its entry points are detoured instead, in
//! the constructor, before the program's threads exist
//! (`platform::arch::detour`): each allocation function the executable
//! defines jumps to the agent's hook, and the hook calls the executable's
//! function through the trampoline.
//!
//! Blocks the executable's allocator handed out before the constructor
//! (the dynamic loader's and the C library's start) are unknown: their
//! releases are passed on and counted, not errors. The anonymous mappings
//! the executable's code makes are taken for its allocator's (left out of
//! the scan's roots, as a separate allocator library's are): a program
//! that keeps its only pointer to a block in a mapping of its own has that
//! block judged lost.

use core::ffi::CStr;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::platform::arch::detour;
use crate::platform::imports;
use crate::platform::sys;

/// The executable's allocator was detoured.
static DETOURED: AtomicBool = AtomicBool::new(false);

/// Whether the executable's allocator was detoured (no longer shadowing).
pub fn detoured() -> bool {
    DETOURED.load(Ordering::Relaxed)
}

/// Detours every allocation function the executable defines itself to the
/// agent's hook of the same name (`own_hooks` lists them, asked only when
/// the executable defines `malloc`); the functions detoured, and those
/// refused with why.
pub fn detour_executable_allocator(
    own_hooks: fn() -> Vec<(&'static CStr, usize)>,
) -> (Vec<&'static CStr>, Vec<(&'static CStr, &'static str)>) {
    let (mut done, mut refused) = (Vec::new(), Vec::new());
    let Some(exe) = imports::modules().first().map(imports::Module::extent) else {
        return (done, refused);
    };
    let defined = |name: &CStr| {
        let f = sys::any_symbol(name);
        // A defined symbol (not a PLT stub an executable exports for a
        // function whose address it takes) inside the executable.
        (exe.contains(&f) && sys::is_definition(f)).then_some(f)
    };
    if defined(c"malloc").is_none() {
        return (done, refused);
    }
    let hooks = own_hooks();
    for &name in crate::events::next_alloc::names() {
        let (Some(f), Some(&(_, hook))) = (defined(name), hooks.iter().find(|(n, _)| *n == name))
        else {
            continue;
        };
        // SAFETY: the executable's function entry; the constructor runs
        // before the program's threads, so nothing runs these bytes now.
        match unsafe { detour::install(f, hook) } {
            Ok(trampoline) => {
                crate::events::next_alloc::set_next(name, trampoline);
                done.push(name);
            }
            Err(why) => refused.push((name, why)),
        }
    }
    if !done.is_empty() {
        DETOURED.store(true, Ordering::Relaxed);
        // The allocator's own mappings are not roots: those the
        // executable's code maps are taken for its allocator's.
        crate::tracking::allocator_maps::set_allocator(Some((exe.start as u64, exe.end as u64)));
        crate::config::OPTIONS
            .blocks_predate
            .store(true, Ordering::Relaxed);
    }
    (done, refused)
}
