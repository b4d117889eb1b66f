//! Inline patching (a detour) for a function no import slot reaches: an
//! allocator linked into the executable, which every module's `malloc`
//! binds to ahead of the preloaded agent.
//!
//! The patch itself is planned by `trapline_detour` (the moved
//! instructions relocated into a trampoline page mapped here within 2 GiB
//! of the function, and the entry's jump); this writes it. Refused, with
//! the function left as it was, where the plan is. The entry is
//! written with a plain store, so only while no other thread can run it
//! (the constructor, before the program's threads).

use trapline_detour::{plan, REACH, READ};

/// Why a function cannot be detoured.
pub type Refusal = &'static str;

/// Points `func`'s entry at `hook`; the trampoline that calls the
/// original function.
///
/// # Safety
/// `func` is the entry of a function in a mapped, executable module, and
/// no other thread runs its first bytes while this writes them.
pub unsafe fn install(func: usize, hook: usize) -> Result<usize, Refusal> {
    // SAFETY: the caller's function entry: READ bytes of code in its module.
    let code = unsafe { core::slice::from_raw_parts(func as *const u8, READ) };
    let page = near_page(func).ok_or("no page within reach of the function")?;
    let page_size = page_size();
    let planned = plan(code, func as u64, page as u64, hook as u64).and_then(|d| {
        if d.trampoline.len() > page_size {
            Err("the trampoline does not fit its page")
        } else {
            Ok(d)
        }
    });
    let d = match planned {
        Ok(d) => d,
        Err(why) => {
            // SAFETY: the fresh page near_page mapped, unused.
            unsafe { libc::munmap(page as *mut libc::c_void, page_size) };
            return Err(why);
        }
    };
    // SAFETY: our own fresh page, writable until made executable below.
    unsafe {
        core::ptr::copy_nonoverlapping(d.trampoline.as_ptr(), page as *mut u8, d.trampoline.len());
        if libc::mprotect(
            page as *mut libc::c_void,
            page_size,
            libc::PROT_READ | libc::PROT_EXEC,
        ) != 0
        {
            return Err("the kernel refused to make the trampoline executable");
        }
    }
    let first = func & !(page_size - 1);
    let last = (func + d.moved - 1) & !(page_size - 1);
    let pages = last - first + page_size;
    // SAFETY: the function's own pages, made writable for the copy of the
    // entry and executable again; the caller's contract keeps every other
    // thread off these bytes meanwhile.
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        if libc::mprotect(first as *mut libc::c_void, pages, rwx) != 0 {
            return Err("the kernel refused to make the function writable");
        }
        core::ptr::copy_nonoverlapping(d.entry.as_ptr(), func as *mut u8, d.moved);
        libc::mprotect(
            first as *mut libc::c_void,
            pages,
            libc::PROT_READ | libc::PROT_EXEC,
        );
    }
    Ok(page)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// A fresh writable page within `REACH` of `addr`: tried below it first
/// (below an executable there is usually room), then above.
fn near_page(addr: usize) -> Option<usize> {
    let size = page_size();
    let step = 1 << 20;
    let base = addr & !(step - 1);
    let candidates = (1..2000usize)
        .map(|k| base.wrapping_sub(k * step))
        .chain((1..2000usize).map(|k| base + k * step));
    for hint in candidates {
        if hint.abs_diff(addr) as u64 >= REACH - size as u64 || hint < 0x10000 {
            continue;
        }
        // SAFETY: an anonymous private mapping at a hint, which the kernel
        // may move (MAP_FIXED_NOREPLACE refuses rather than replaces).
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return Some(p as usize);
        }
    }
    None
}
