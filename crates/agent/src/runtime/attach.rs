//! Attaching to a running process (`trapline attach`) and detaching.
//!
//! The CLI loads the library into the process and calls its entry point
//! (hooks/attach.rs), which starts recording (`lifecycle::init_attached`)
//! and then points the program's import slots at the hooks: every module's
//! GOT entry for a trapped function that is bound to the function the hook
//! forwards to (or not bound yet: a lazy PLT stub of the module's own). A
//! slot bound to anything else (a function the program or a preloaded
//! library defines itself) is left alone. Modules loaded later are patched
//! by the dlopen hook. Detaching puts every patched slot back, in reverse
//! order, where its module is still loaded, then ends the trace; the hooks
//! stay in memory (a thread may be inside one) and pass every call on.

use core::ffi::CStr;
use std::sync::Mutex;

use crate::platform::imports::{self, Module};
use crate::platform::sys;

/// A slot changed: where, whether it is in RELRO, what it held, and the
/// hook written there.
struct Patch {
    slot: usize,
    relro: bool,
    original: usize,
    hook: usize,
}

struct State {
    /// Trapped functions: (name, hook, the function the hook forwards to).
    table: Vec<(&'static CStr, usize, usize)>,
    /// The load biases of the modules whose slots were gone through.
    done: Vec<usize>,
    patches: Vec<Patch>,
    detached: bool,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Starts recording with `options` and patches the loaded modules; the
/// number of slots patched. `hooks` pairs each trapped function's name
/// with its hook.
pub fn attach(
    options: &str,
    resolve_hooks: fn(),
    hooks: &[(&'static CStr, usize)],
) -> Result<usize, String> {
    crate::runtime::lifecycle::init_attached(options, resolve_hooks)?;
    let table = hooks
        .iter()
        .filter_map(|&(name, hook)| match sys::next_symbol(name) {
            0 => None,
            real => Some((name, hook, real)),
        })
        .collect();
    crate::services::control::on_detach(detach);
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    *state = Some(State {
        table,
        done: Vec::new(),
        patches: Vec::new(),
        detached: false,
    });
    let s = state.as_mut().expect("just set");
    patch_new(s);
    Ok(s.patches.len())
}

/// Patches the modules loaded since the last time (the dlopen hook).
pub fn patch_new_modules() {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = state.as_mut().filter(|s| !s.detached) {
        patch_new(s);
    }
}

/// Whether a module's slots are patched: the executable's and every
/// library's but the agent's, the dynamic loader's (its few calls are its
/// own business) and the vDSO's.
fn patchable(m: &Module, own: usize, first: bool) -> bool {
    if first {
        return true;
    }
    let path = m.path().to_bytes();
    if path.is_empty() || m.base == own {
        return false;
    }
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    !(is_loader(m) || name.starts_with(b"linux-vdso") || name.starts_with(b"linux-gate"))
}

/// Whether `m` is glibc's dynamic loader.
fn is_loader(m: &Module) -> bool {
    trapline_contract::elf::is_glibc_loader(m.path().to_bytes())
}

fn patch_new(s: &mut State) {
    let own = sys::own_module().dli_fbase as usize;
    for (i, m) in imports::modules().iter().enumerate() {
        if is_loader(m) {
            let code = m.extent();
            crate::events::record::note_loader_code(code.start as u64, code.end as u64);
        }
        if s.done.contains(&m.base) || !patchable(m, own, i == 0) {
            continue;
        }
        s.done.push(m.base);
        let extent = m.extent();
        m.for_each_slot(|slot| {
            let Some(&(_, hook, real)) = s.table.iter().find(|(name, _, _)| *name == slot.name)
            else {
                return;
            };
            let value = imports::read(slot.addr);
            // Bound to what the hook forwards to, or to the module's own
            // lazy-binding stub.
            if value != real && !extent.contains(&value) {
                return;
            }
            if imports::write(slot.addr, slot.relro, hook) {
                s.patches.push(Patch {
                    slot: slot.addr,
                    relro: slot.relro,
                    original: value,
                    hook,
                });
            }
        });
    }
}

/// `detach`: every slot back where its module is still loaded and the
/// slot still holds the hook, then the trace's end. The slots put back.
fn detach() -> Result<usize, String> {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = state.as_mut() else {
        return Err("not attached".into());
    };
    if s.detached {
        return Err("already detached".into());
    }
    s.detached = true;
    let loaded: Vec<core::ops::Range<usize>> =
        imports::modules().iter().map(Module::extent).collect();
    let mut restored = 0;
    for p in s.patches.iter().rev() {
        let mapped = loaded.iter().any(|r| r.contains(&p.slot));
        if mapped && imports::read(p.slot) == p.hook && imports::write(p.slot, p.relro, p.original)
        {
            restored += 1;
        }
    }
    drop(state);
    crate::runtime::lifecycle::finish_detached();
    Ok(restored)
}
