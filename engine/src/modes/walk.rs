//! Walks an epoch's sequence of records: position -> record id, through the table and
//! the units, forward only (restarting from the top when asked for an earlier position).

use crate::order::{EpochTable, Units};

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

    fn load(&mut self) {
        if self.t < self.table.len() {
            let r = self.units.records(self.table.unit_at(self.t));
            self.first = r.start;
            self.end = r.end;
        }
    }

    /// The record at sequence position `p` (< the number of records), and the table index
    /// of its unit.
    pub(crate) fn at(&mut self, p: u64) -> (u64, u64) {
        if p < self.pos {
            self.t = 0;
            self.pos = 0;
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
