//! The recorder's view of the heap: live blocks, blocks freed lately (for
//! telling a double free from an invalid one), and interned stacks.

use std::collections::{HashMap, VecDeque};

use trapline_trace::{AllocFn, Event};

#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub size: u64,
    pub func: AllocFn,
    pub stack: u32,
}

#[derive(Clone, Copy, Debug)]
pub struct Freed {
    pub block: Block,
    pub free_stack: u32,
}

/// Freed blocks remembered, as the agent's recently-freed ring.
const FREED_KEPT: usize = 1 << 16;

#[derive(Default)]
pub struct Heap {
    pub live: HashMap<u64, Block>,
    freed: HashMap<u64, Freed>,
    freed_order: VecDeque<u64>,
    stacks: HashMap<Vec<u64>, u32>,
    /// Each stack's innermost frame, by id - 1.
    innermost: Vec<u64>,
}

impl Heap {
    /// The id of `frames`, and whether it is new (its definition is due).
    pub fn intern(&mut self, frames: Vec<u64>) -> (u32, Option<Vec<u64>>) {
        if let Some(&id) = self.stacks.get(&frames) {
            return (id, None);
        }
        let id = self.stacks.len() as u32 + 1;
        self.innermost.push(frames.first().copied().unwrap_or(0));
        self.stacks.insert(frames.clone(), id);
        (id, Some(frames))
    }

    /// The innermost frame of stack `id` (0: none).
    pub fn innermost(&self, id: u32) -> u64 {
        id.checked_sub(1)
            .and_then(|i| self.innermost.get(i as usize))
            .copied()
            .unwrap_or(0)
    }

    pub fn allocated(&mut self, addr: u64, block: Block) {
        self.freed.remove(&addr);
        self.live.insert(addr, block);
    }

    /// Removes a live block; `None` when `addr` is not one.
    pub fn released(&mut self, addr: u64, free_stack: u32) -> Option<Block> {
        let block = self.live.remove(&addr)?;
        if self.freed_order.len() == FREED_KEPT {
            if let Some(old) = self.freed_order.pop_front() {
                self.freed.remove(&old);
            }
        }
        self.freed_order.push_back(addr);
        self.freed.insert(addr, Freed { block, free_stack });
        Some(block)
    }

    pub fn freed_lately(&self, addr: u64) -> Option<Freed> {
        self.freed.get(&addr).copied()
    }

    /// The exit snapshot of the live blocks, unjudged: a `LiveBlock` each,
    /// by address, then `SnapshotEnd`; with the blocks and bytes counted.
    pub fn live_snapshot(&self) -> (Vec<Event>, u64, u64) {
        let mut live: Vec<(u64, Block)> = self.live.iter().map(|(a, b)| (*a, *b)).collect();
        live.sort_unstable_by_key(|(addr, _)| *addr);
        let bytes = live.iter().map(|(_, b)| b.size).sum();
        let blocks = live.len() as u64;
        let mut events: Vec<Event> = live
            .into_iter()
            .map(|(addr, b)| Event::LiveBlock {
                addr,
                size: b.size,
                func: b.func,
                stack: b.stack,
            })
            .collect();
        events.push(Event::SnapshotEnd { blocks, bytes });
        (events, blocks, bytes)
    }
}
