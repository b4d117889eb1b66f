//! Replaying allocations and releases: which blocks are live, and how much
//! the heap was used. Fed with the events of all threads in time order (see
//! [`crate::index`]); its memory is one entry per live block.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use trapline_trace::{AllocFn, Event};

use crate::report::HeapUsage;

/// Hashes block addresses: one multiplication instead of SipHash, which
/// matters at millions of events per second. Addresses are not chosen by an
/// adversary, and the high bits of the product mix in all of the address.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 ^= self.0 >> 32;
    }
}

/// A map keyed by address.
pub(crate) type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// A live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub size: u64,
    pub func: AllocFn,
    pub stack: u32,
}

/// The heap as the recorded events built it.
#[derive(Default)]
pub(crate) struct HeapReplay {
    /// Live blocks by address.
    pub live: AddrMap<Block>,
    /// Sum of the live blocks' sizes.
    pub live_bytes: u64,
    /// Blocks allocated and released, bytes requested.
    pub usage: HeapUsage,
}

impl HeapReplay {
    /// Applies one event (all but Alloc, Free and Realloc are ignored).
    ///
    /// A realloc with `old_addr` 0 only allocates; one with `new_addr` 0 and
    /// size 0 (realloc(p, 0)) only releases; one with `new_addr` 0 and a size
    /// failed and leaves the old block alone; any other releases the old block
    /// and allocates the new one (possibly at the same address).
    pub fn apply(&mut self, ev: &Event) {
        match *ev {
            Event::Alloc {
                addr,
                size,
                func,
                stack,
                ..
            } => self.allocate(addr, Block { size, func, stack }),
            Event::Free { addr, .. } => self.release(addr),
            Event::Realloc {
                old_addr,
                new_addr,
                size,
                func,
                stack,
                ..
            } => {
                if new_addr == 0 && size != 0 {
                    return;
                }
                if old_addr != 0 {
                    self.release(old_addr);
                }
                if new_addr != 0 {
                    self.allocate(new_addr, Block { size, func, stack });
                }
            }
            _ => {}
        }
    }

    fn allocate(&mut self, addr: u64, block: Block) {
        self.usage.allocs += 1;
        self.usage.bytes_allocated += block.size;
        // An address still live means its release was not recorded.
        if let Some(old) = self.live.insert(addr, block) {
            self.live_bytes -= old.size;
        }
        self.live_bytes += block.size;
    }

    fn release(&mut self, addr: u64) {
        self.usage.frees += 1;
        if let Some(old) = self.live.remove(&addr) {
            self.live_bytes -= old.size;
        }
    }
}
