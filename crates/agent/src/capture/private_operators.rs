//! C++ `operator new` and `operator delete` that the agent does not
//! interpose: a library's own definitions, bound inside it (LLVM's
//! `libLLVM.so`, linked with `-Bsymbolic-functions`, has them, over
//! `malloc` and `free`). The library's calls reach them, and through them
//! `malloc` and `free`, which the agent records as such; the program's
//! calls reach the agent's. A block that crosses between the two looked
//! like a mismatched release: rust-lld, linking a hello-world under
//! `cargo build`, reported 128 "mismatched free" errors (`malloc` in
//! libLLVM's `operator new`, released by `operator delete` in rust-lld).
//!
//! So before a mismatch is reported, the allocation's innermost frame and
//! the release's are looked at: a call of `malloc` made by such an
//! `operator new`, or of `free` by such an `operator delete`, makes the
//! block the private operators' business, and no mismatch of family, size
//! or alignment is reported (libLLVM's `new[]` is its `new`; its sized
//! `delete` ignores the size). A frame is such a call when its return
//! address lies inside a function named `operator new` or `operator
//! delete` (global `_Znw`/`_Zna`/`_Zdl`/`_Zda`, or a class's), or when the
//! instruction before it is a direct call of one: libLLVM's `delete` ends
//! in a jump to `free`, so `free` returns to `delete`'s caller.
//!
//! Only on the path of a would-be error: the lookup is the loader's
//! `dladdr1`, a scan of the module's symbols, so verdicts are kept per
//! return address.

use core::sync::atomic::{AtomicU64, Ordering};

/// Verdicts by return address: `address << 1 | private`, direct-mapped.
static VERDICTS: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];

/// Whether the call that returns to `return_address` was made by a C++
/// `operator new` or `operator delete` that the agent did not interpose.
pub fn call_from_private_operator(return_address: u64) -> bool {
    if !(8..1 << 48).contains(&return_address) {
        return false;
    }
    let slot = &VERDICTS[(return_address as usize >> 2) % VERDICTS.len()];
    let seen = slot.load(Ordering::Relaxed);
    if seen >> 1 == return_address {
        return seen & 1 != 0;
    }
    let private = is_operator_at(return_address - 1) || calls_operator_before(return_address);
    slot.store(return_address << 1 | u64::from(private), Ordering::Relaxed);
    private
}

fn is_operator_at(addr: u64) -> bool {
    crate::platform::sys::symbol_containing(addr).is_some_and(|name| {
        !crate::capture::modules::is_agent_pc(addr) && is_operator(name.to_bytes())
    })
}

/// The instruction before `return_address` is a direct call of an operator.
fn calls_operator_before(return_address: u64) -> bool {
    crate::platform::arch::direct_call_target(return_address).is_some_and(is_operator_at)
}

/// `operator new`, `new[]`, `delete` or `delete[]` by mangled name: global
/// (`_Znwm`, `_ZdlPvm`, ...) or a class's (`_ZN4llvm6MDNodedlEPv`).
fn is_operator(name: &[u8]) -> bool {
    if ["_Znw", "_Zna", "_Zdl", "_Zda"]
        .iter()
        .any(|p| name.starts_with(p.as_bytes()))
    {
        return true;
    }
    name.starts_with(b"_ZN")
        && ["nwEm", "naEm", "dlEPv", "daEPv"]
            .iter()
            .any(|op| name.windows(op.len()).any(|w| w == op.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::is_operator;

    #[test]
    fn operators_by_mangled_name() {
        for name in [
            "_Znwm",
            "_ZnamRKSt9nothrow_t",
            "_ZdlPv",
            "_ZdaPvmSt11align_val_t",
            "_ZN4llvm6MDNodedlEPv",
            "_ZN4llvm4UsernwEm",
        ] {
            assert!(is_operator(name.as_bytes()), "{name}");
        }
        for name in [
            "malloc",
            "_ZN4llvm6MDNode6HeaderD1Ev",
            "_Z6xalloc",
            "_ZNSt6vectorIiSaIiEE9push_backERKi",
        ] {
            assert!(!is_operator(name.as_bytes()), "{name}");
        }
    }
}
