//! Walks an epoch's sequence of records: position -> record id, through the table and
//! the units, forward only (restarting from the top when asked for an earlier position).

use crate::order::{EpochTable, Units};

/// Units whose record ranges are looked up at once, ahead of the walk: the lookups (a random
/// entry of the units' starts each, a cache miss apiece on a large dataset) do not depend on
/// one another, so their misses overlap instead of coming one after the other.
const AHEAD: usize = 16;

pub(crate) struct Walker<'a> {
    /// Whether reads may merge across units (baselines, whose units are not shuffling units).
    merge_units: bool,
    table: &'a EpochTable,
    units: &'a Units,
    /// Index in the table of the current unit.
    t: u64,
    /// Its records.
    first: u64,
    end: u64,
    /// Sequence position of `first`.
    pos: u64,
    /// The record ranges (start, end) of the units at table indexes `t + 1 ..`, looked up
    /// ahead: `ahead[next..filled]`.
    ahead: [(u64, u64); AHEAD],
    next: usize,
    filled: usize,
}

impl<'a> Walker<'a> {
    pub(crate) fn new(table: &'a EpochTable, units: &'a Units) -> Self {
        let mut w = Walker {
            merge_units: false,
            table,
            units,
            t: 0,
            first: 0,
            end: 0,
            pos: 0,
            ahead: [(0, 0); AHEAD],
            next: 0,
            filled: 0,
        };
        w.load();
        w
    }

    /// A walker over a baseline's order: reads merge by contiguity alone.
    pub(crate) fn baseline(table: &'a EpochTable, units: &'a Units) -> Self {
        let mut w = Walker::new(table, units);
        w.merge_units = true;
        w
    }

    /// Loads unit `t`'s records (the next of those looked up ahead, which are looked up
    /// again from `t` on when none is left).
    fn load(&mut self) {
        if self.t >= self.table.len() {
            return;
        }
        if self.next == self.filled {
            let n = (self.table.len() - self.t).min(AHEAD as u64) as usize;
            for (k, slot) in self.ahead[..n].iter_mut().enumerate() {
                let r = self.units.records(self.table.unit_at(self.t + k as u64));
                *slot = (r.start, r.end);
            }
            self.next = 0;
            self.filled = n;
        }
        (self.first, self.end) = self.ahead[self.next];
        self.next += 1;
    }

    /// The record at sequence position `p` (< the number of records), and the table index
    /// of its unit.
    pub(crate) fn at(&mut self, p: u64) -> (u64, u64) {
        if p < self.pos {
            self.t = 0;
            self.pos = 0;
            (self.next, self.filled) = (0, 0);
            self.load();
        }
        while p >= self.pos + (self.end - self.first) {
            self.pos += self.end - self.first;
            self.t += 1;
            self.load();
        }
        let unit = if self.merge_units { 0 } else { self.t };
        (self.first + (p - self.pos), unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::EpochKey;

    /// The units looked up ahead (in runs of `AHEAD`) give the sequence the table and the
    /// units give one unit at a time: across a run's end, at the table's end, and after a
    /// walk restarted from an earlier position.
    #[test]
    fn the_walk_looked_up_ahead_is_the_table_order() {
        // 37 units of 7 records and a last one of 2: runs of 16 end inside the table.
        let units = Units::blocks(37 * 7 + 2, 7);
        let table = EpochTable::build(units.len(), &EpochKey::new(3, 1));
        let mut want = Vec::new();
        for t in 0..table.len() {
            for id in units.records(table.unit_at(t)) {
                want.push((id, t));
            }
        }
        assert_eq!(want.len() as u64, 37 * 7 + 2);
        let mut w = Walker::new(&table, &units);
        let got: Vec<_> = (0..want.len() as u64).map(|p| w.at(p)).collect();
        assert_eq!(got, want);
        // Back to an earlier position, then on past where the first walk's run ended.
        for p in [5u64, 200, 3, 120, 259] {
            assert_eq!(w.at(p), want[p as usize], "position {p}");
        }
    }
}
