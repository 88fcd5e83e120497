//! The per-bucket key index of merge-on-write tables (`table/key_index.py`), natively.
//!
//! A level is a sorted array of key images (`merge/versions.py`'s `sortable_key`: integers of
//! any width, or fixed-width byte strings that compare like the key) with a locator per entry
//! (`file number << 40 | row position`). The functions here are `key_index.py`'s `_find`,
//! `KeyIndex.search`, `_merge` and `build`, with the same inputs and outputs.

use std::cmp::Ordering;

use rayon::prelude::*;

use crate::error::{KernelError, Result};

/// Row positions take the low bits of a locator, the file's number in the index the rest.
pub const POSITION_BITS: u32 = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Little-endian two's complement integers of `width` bytes.
    Signed,
    /// Little-endian unsigned integers of `width` bytes.
    Unsigned,
    /// Byte strings of `width` bytes, compared as bytes.
    Bytes,
}

/// A level's (or a batch's) key images, borrowed: `data` holds `len` values of `width` bytes.
#[derive(Clone, Copy, Debug)]
pub struct Image<'a> {
    pub kind: Kind,
    pub width: usize,
    pub data: &'a [u8],
}

impl<'a> Image<'a> {
    pub fn new(kind: Kind, width: usize, data: &'a [u8]) -> Result<Self> {
        let int_width = matches!(width, 1 | 2 | 4 | 8);
        if width == 0 || !data.len().is_multiple_of(width) || (kind != Kind::Bytes && !int_width) {
            return Err(KernelError::invalid(format!(
                "Key images of {width} bytes cannot hold {} bytes of {kind:?} values",
                data.len()
            )));
        }
        Ok(Image { kind, width, data })
    }

    pub fn len(&self) -> usize {
        self.data.len() / self.width
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    #[inline]
    fn bytes(&self, i: usize) -> &'a [u8] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// Entry `i` as an unsigned integer that orders as the entries do. Each width reads a
    /// fixed-size array (a plain load), which the comparisons of a search are mostly made of.
    #[inline]
    fn int(&self, i: usize) -> u64 {
        let d = self.data;
        let (value, bits) = match self.width {
            8 => (u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().unwrap()), 64),
            4 => (u32::from_le_bytes(d[i * 4..i * 4 + 4].try_into().unwrap()) as u64, 32),
            2 => (u16::from_le_bytes(d[i * 2..i * 2 + 2].try_into().unwrap()) as u64, 16),
            _ => (d[i] as u64, 8),
        };
        match self.kind {
            // Flipping the sign bit orders two's complement values as unsigned ones.
            Kind::Signed => value ^ (1 << (bits - 1)),
            _ => value,
        }
    }

    /// Compare entry `i` of `self` with entry `j` of `other` (same kind and width).
    #[inline]
    pub fn cmp_with(&self, i: usize, other: &Image, j: usize) -> Ordering {
        match self.kind {
            Kind::Bytes => self.bytes(i).cmp(other.bytes(j)),
            _ => self.int(i).cmp(&other.int(j)),
        }
    }

    fn same_shape(&self, other: &Image) -> Result<()> {
        if self.kind != other.kind || self.width != other.width {
            return Err(KernelError::invalid(format!(
                "Key images differ: {:?} of {} bytes against {:?} of {} bytes",
                self.kind, self.width, other.kind, other.width
            )));
        }
        Ok(())
    }
}

/// Keys a task of [`find`] takes: ascending keys within one are searched from the last answer.
const FIND_CHUNK: usize = 32768;

/// Per key: whether `level` (sorted) holds it, and where it is or would go. Keys usually come
/// sorted (a write's keys are cut in key order): each task walks its keys in order and
/// searches from the last answer while they ascend, and from the start when one does not.
/// Each kind and width of image gets its own monomorphic loop, so that a comparison is a
/// load and a compare rather than a call.
pub fn find(level: &Image, keys: &Image) -> Result<(Vec<bool>, Vec<i64>)> {
    level.same_shape(keys)?;
    let (l, k) = (level.data, keys.data);
    let (n, m) = (level.len(), keys.len());
    Ok(match (level.kind, level.width) {
        (Kind::Signed, 8) => find_by(n, |i| i64_at(l, i), m, |j| i64_at(k, j)),
        (Kind::Unsigned, 8) => find_by(n, |i| u64_at(l, i), m, |j| u64_at(k, j)),
        (Kind::Bytes, w) => find_by(n, |i| &l[i * w..(i + 1) * w], m, |j| &k[j * w..(j + 1) * w]),
        _ => find_by(n, |i| level.int(i), m, |j| keys.int(j)),
    })
}

#[inline(always)]
fn i64_at(data: &[u8], i: usize) -> i64 {
    i64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap())
}

#[inline(always)]
fn u64_at(data: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap())
}

/// Where `key` goes in `level[lo..hi]` (sorted): the first entry not below it.
#[inline(always)]
fn lower_bound<K: Ord>(level: &impl Fn(usize) -> K, mut lo: usize, mut hi: usize, key: &K) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if level(mid) < *key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// As [`lower_bound`] over `level[lo..n]`, for a key known not to go before `lo`: gallops from
/// `lo` (steps 1, 2, 4, ...) before the binary search, so that a run of ascending keys costs a
/// few comparisons each near the last answer (numpy's `searchsorted` likewise keeps its lower
/// bound between ascending keys).
#[inline(always)]
fn gallop<K: Ord>(level: &impl Fn(usize) -> K, lo: usize, n: usize, key: &K) -> usize {
    let (mut below, mut step) = (lo, 1usize);
    // Every entry before `below` is below the key.
    while below + step <= n && level(below + step - 1) < *key {
        below += step;
        step *= 2;
    }
    lower_bound(level, below, (below + step).min(n), key)
}

fn find_by<K: Ord>(
    n: usize,
    level: impl Fn(usize) -> K + Sync,
    m: usize,
    key: impl Fn(usize) -> K + Sync,
) -> (Vec<bool>, Vec<i64>) {
    let mut found = vec![false; m];
    let mut at = vec![0i64; m];
    let walk = |start: usize, found: &mut [bool], at: &mut [i64]| {
        let mut last: Option<(usize, K)> = None;
        for (offset, (found, at)) in found.iter_mut().zip(at.iter_mut()).enumerate() {
            let this = key(start + offset);
            let pos = match &last {
                Some((prev, prev_key)) if this >= *prev_key => gallop(&level, *prev, n, &this),
                _ => lower_bound(&level, 0, n, &this),
            };
            *found = pos < n && level(pos) == this;
            *at = pos as i64;
            last = Some((pos, this));
        }
    };
    if m <= FIND_CHUNK {
        // One task: on the calling thread, without waking Rayon's.
        walk(0, &mut found, &mut at);
    } else {
        found
            .par_chunks_mut(FIND_CHUNK)
            .zip(at.par_chunks_mut(FIND_CHUNK))
            .enumerate()
            .for_each(|(c, (found, at))| walk(c * FIND_CHUNK, found, at));
    }
    (found, at)
}

/// `KeyIndex.search`: `(slots, indices into keys)` of the keys live in the index (`dead`: one
/// byte per base entry, non-zero where deleted); slots below
/// `base.len()` are base entries, the others `base.len() +` a recent entry.
pub fn search(base: &Image, dead: &[u8], recent: &Image, keys: &Image) -> Result<(Vec<i64>, Vec<i64>)> {
    if dead.len() != base.len() {
        return Err(KernelError::invalid(format!(
            "{} dead flags for {} base entries",
            dead.len(),
            base.len()
        )));
    }
    let (in_base, at_base) = find(base, keys)?;
    let (in_recent, at_recent) = find(recent, keys)?;
    let n = base.len() as i64;
    let mut slots = Vec::new();
    let mut incoming = Vec::new();
    for j in 0..keys.len() {
        if in_base[j] && dead[at_base[j] as usize] == 0 {
            slots.push(at_base[j]);
            incoming.push(j as i64);
        } else if in_recent[j] {
            slots.push(n + at_recent[j]);
            incoming.push(j as i64);
        }
    }
    Ok((slots, incoming))
}

/// Two sorted levels as one, with their locators; `None` if they share a key.
///
/// Levels of 8-byte integers whose lengths are within [`WALK_RATIO`] of each other (the
/// recent level and a write's keys, or a base and the recent level it takes in) are merged
/// in one walk over both, an entry at a time. Otherwise the shorter level's keys each gallop
/// from the last one's place in the longer, and the entries between two of them are copied
/// in one piece: that wins when they are far apart, and loses to the walk when they are a few
/// entries apart (a copy call per few entries). Each kind and width of image gets its own
/// loop, as in [`find`].
pub fn merge(a: &Image, a_locators: &[i64], b: &Image, b_locators: &[i64]) -> Result<Option<(Vec<u8>, Vec<i64>)>> {
    a.same_shape(b)?;
    if a_locators.len() != a.len() || b_locators.len() != b.len() {
        return Err(KernelError::invalid("Each key image needs one locator"));
    }
    let (ad, bd) = (a.data, b.data);
    let (n, m) = (a.len(), b.len());
    if a.width == 8 && a.kind != Kind::Bytes && n.max(m) <= WALK_RATIO * n.min(m).max(1) {
        return Ok(match a.kind {
            Kind::Signed => merge_walk(ad, a_locators, bd, b_locators, i64_at),
            _ => merge_walk(ad, a_locators, bd, b_locators, u64_at),
        });
    }
    let cuts = match (a.kind, a.width) {
        (Kind::Signed, 8) => merge_cuts(n, |i| i64_at(ad, i), m, |j| i64_at(bd, j)),
        (Kind::Unsigned, 8) => merge_cuts(n, |i| u64_at(ad, i), m, |j| u64_at(bd, j)),
        (Kind::Bytes, w) => merge_cuts(n, |i| &ad[i * w..(i + 1) * w], m, |j| &bd[j * w..(j + 1) * w]),
        _ => merge_cuts(n, |i| a.int(i), m, |j| b.int(j)),
    };
    let Some(cuts) = cuts else {
        return Ok(None);
    };
    let w = a.width;
    let mut data = Vec::with_capacity(ad.len() + bd.len());
    let mut locators = Vec::with_capacity(n + m);
    let mut done = 0;
    for (j, &cut) in cuts.iter().enumerate() {
        data.extend_from_slice(&ad[done * w..cut * w]);
        locators.extend_from_slice(&a_locators[done..cut]);
        data.extend_from_slice(b.bytes(j));
        locators.push(b_locators[j]);
        done = cut;
    }
    data.extend_from_slice(&ad[done * w..]);
    locators.extend_from_slice(&a_locators[done..]);
    Ok(Some((data, locators)))
}

/// Levels further apart in length than this are merged by galloping (see [`merge`]).
const WALK_RATIO: usize = 32;

/// [`merge`] of two levels of 8-byte integers (`key` reads one, ordered as the entries): `a`
/// copied into the end of the output, then `b` merged in from the front
/// ([`merge_walk_in_place`]).
fn merge_walk<K: Ord>(
    a: &[u8],
    a_locators: &[i64],
    b: &[u8],
    b_locators: &[i64],
    key: impl Fn(&[u8], usize) -> K,
) -> Option<(Vec<u8>, Vec<i64>)> {
    let m = b_locators.len();
    let mut data = vec![0u8; a.len() + b.len()];
    let mut locators = vec![0i64; a_locators.len() + m];
    data[m * 8..].copy_from_slice(a);
    locators[m..].copy_from_slice(a_locators);
    merge_walk_in_place(&mut data, &mut locators, b, b_locators, key).then_some((data, locators))
}

/// Whether an entry of `level` (sorted) that `dead` does not mark holds one of `keys`
/// (sorted). Lengths within [`WALK_RATIO`] are walked together (the branch that advances the
/// longer one is mostly taken, so it is predicted); others are searched by [`find`].
fn live_in(level: &Image, dead: &[u8], keys: &Image) -> Result<bool> {
    let (n, m) = (level.len(), keys.len());
    if level.width == 8 && level.kind != Kind::Bytes && n.max(m) <= WALK_RATIO * n.min(m).max(1) {
        return Ok(match level.kind {
            Kind::Signed => live_walk(level.data, dead, keys.data, i64_at),
            _ => live_walk(level.data, dead, keys.data, u64_at),
        });
    }
    let (found, at) = find(level, keys)?;
    Ok(found.iter().zip(&at).any(|(f, a)| *f && dead[*a as usize] == 0))
}

fn live_walk<K: Ord>(level: &[u8], dead: &[u8], keys: &[u8], key: impl Fn(&[u8], usize) -> K) -> bool {
    let (n, m) = (dead.len(), keys.len() / 8);
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        match key(level, i).cmp(&key(keys, j)) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                if dead[i] == 0 {
                    return true;
                }
                i += 1;
                j += 1;
            }
        }
    }
    false
}

/// Entry `i` of 8-byte images `from`, appended to `data`.
#[inline(always)]
fn push_entry8(data: &mut Vec<u8>, from: &[u8], i: usize) {
    let entry: [u8; 8] = from[i * 8..i * 8 + 8].try_into().unwrap();
    data.extend_from_slice(&entry);
}

/// Entry `i` of images `from` of `width` bytes, appended to `data` (a fixed-size copy for
/// the integer widths).
#[inline(always)]
fn push_entry(data: &mut Vec<u8>, from: &[u8], i: usize, width: usize) {
    match width {
        8 => push_entry8(data, from, i),
        4 => {
            let entry: [u8; 4] = from[i * 4..i * 4 + 4].try_into().unwrap();
            data.extend_from_slice(&entry);
        }
        _ => data.extend_from_slice(&from[i * width..(i + 1) * width]),
    }
}

/// For each entry of `b` (sorted), how many entries of `a` (sorted) go before it; `None` when
/// `a` holds one of `b`'s keys.
fn merge_cuts<K: Ord>(n: usize, a: impl Fn(usize) -> K, m: usize, b: impl Fn(usize) -> K) -> Option<Vec<usize>> {
    let mut cuts = Vec::with_capacity(m);
    let mut lo = 0;
    for j in 0..m {
        let key = b(j);
        let at = gallop(&a, lo, n, &key);
        if at < n && a(at) == key {
            return None;
        }
        cuts.push(at);
        lo = at;
    }
    Some(cuts)
}

/// One bucket's index after a commit: new dead flags and recent level over the same base, or
/// (once the recent level grew past its share) one new base holding every live key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advanced {
    Levels { dead: Vec<u8>, recent: Vec<u8>, recent_locators: Vec<i64> },
    Base { base: Vec<u8>, base_locators: Vec<i64> },
}

/// `KeyIndex.advanced`: the rows at `removed` slots marked deleted (base slots in `dead`,
/// recent ones dropped), then each of the `added` files' sorted images merged into the recent
/// level, file `first_file + k` for the `k`-th. Once the recent level holds more than
/// `1/recent_share` of the base (or of 4096 entries, for a small base), the base's live
/// entries and the recent level are merged into a new base. `None` when a written key is
/// still live in the base or already in the recent level, or an image is of another type:
/// the index would not hold each key once.
#[allow(clippy::too_many_arguments)]
pub fn advance(
    base: &Image,
    base_locators: &[i64],
    dead: &[u8],
    recent: &Image,
    recent_locators: &[i64],
    removed: &[i64],
    added: &[Image],
    first_file: i64,
    recent_share: usize,
) -> Result<Option<Advanced>> {
    let n = base.len();
    base.same_shape(recent)?;
    if dead.len() != n || base_locators.len() != n || recent_locators.len() != recent.len() {
        return Err(KernelError::invalid("Each level entry needs one dead flag and one locator"));
    }
    let mut dead = dead.to_vec();
    let mut keep = vec![true; recent.len()];
    for &slot in removed {
        match usize::try_from(slot) {
            Ok(s) if s < n => dead[s] = 1,
            Ok(s) if s - n < keep.len() => keep[s - n] = false,
            _ => return Err(KernelError::invalid(format!("Slot {slot} is outside the index"))),
        }
    }
    let width = recent.width;
    let mut data = Vec::new();
    let mut locators = Vec::new();
    let mut kept = false; // whether `data` holds the kept recent entries yet
    for (k, image) in added.iter().enumerate() {
        if image.kind != base.kind || image.width != base.width {
            return Ok(None);
        }
        if image.len() as u64 >= 1 << POSITION_BITS {
            return Err(KernelError::unsupported("A file of 2**40 rows or more"));
        }
        if live_in(base, &dead, image)? {
            return Ok(None); // a written key still live in the base
        }
        let file = (first_file + k as i64) << POSITION_BITS;
        let rows: Vec<i64> = (0..image.len() as i64).map(|r| file | r).collect();
        let merged = if kept {
            merge(&Image::new(recent.kind, width, &data)?, &locators, image, &rows)?
        } else {
            kept = true;
            kept_merged(recent, recent_locators, |i| keep[i], image, &rows)?
        };
        match merged {
            None => return Ok(None),
            Some((d, l)) => (data, locators) = (d, l),
        }
    }
    if !kept {
        (data, locators) = kept_entries(recent, recent_locators, |i| keep[i]);
    }
    if locators.len() * recent_share <= n.max(4096) {
        return Ok(Some(Advanced::Levels { dead, recent: data, recent_locators: locators }));
    }
    let recent = Image::new(base.kind, width, &data)?;
    Ok(kept_merged(base, base_locators, |i| dead[i] == 0, &recent, &locators)?
        .map(|(base, base_locators)| Advanced::Base { base, base_locators }))
}

/// The entries of `level` that `keep` selects, with their locators.
fn kept_entries(level: &Image, locators: &[i64], keep: impl Fn(usize) -> bool) -> (Vec<u8>, Vec<i64>) {
    let mut data = Vec::with_capacity(level.data.len());
    let mut out = Vec::with_capacity(locators.len());
    for i in (0..locators.len()).filter(|i| keep(*i)) {
        push_entry(&mut data, level.data, i, level.width);
        out.push(locators[i]);
    }
    (data, out)
}

/// The entries of `level` that `keep` selects merged with `extra` (sorted, with its
/// locators), as [`merge`] gives them; `None` if they share a key. For 8-byte integers, in
/// one buffer without an intermediate level: the kept entries are packed at its end (each
/// entry written, the write position advanced only past kept ones, so no branch), then
/// `extra` is merged in from the front ([`merge_walk_in_place`]).
fn kept_merged(
    level: &Image,
    locators: &[i64],
    keep: impl Fn(usize) -> bool,
    extra: &Image,
    extra_locators: &[i64],
) -> Result<Option<(Vec<u8>, Vec<i64>)>> {
    level.same_shape(extra)?;
    if extra_locators.len() != extra.len() || locators.len() != level.len() {
        return Err(KernelError::invalid("Each key image needs one locator"));
    }
    let (n, m) = (level.len(), extra.len());
    if level.width != 8 || level.kind == Kind::Bytes || n.max(m) > WALK_RATIO * n.min(m).max(1) {
        let (data, kept) = kept_entries(level, locators, keep);
        return merge(&Image::new(level.kind, level.width, &data)?, &kept, extra, extra_locators);
    }
    // One spare slot: a dropped last entry is written there before the position stays.
    let mut data = vec![0u8; (m + n + 1) * 8];
    let mut out = vec![0i64; m + n + 1];
    let mut at = m;
    for (i, &locator) in locators.iter().enumerate() {
        data[at * 8..at * 8 + 8].copy_from_slice(&level.data[i * 8..i * 8 + 8]);
        out[at] = locator;
        at += keep(i) as usize;
    }
    data.truncate(at * 8);
    out.truncate(at);
    let merged = match level.kind {
        Kind::Signed => merge_walk_in_place(&mut data, &mut out, extra.data, extra_locators, i64_at),
        _ => merge_walk_in_place(&mut data, &mut out, extra.data, extra_locators, u64_at),
    };
    Ok(merged.then_some((data, out)))
}

/// Merges `b` into level `a`, which sits in `data` and `locators` after room for `b` (their
/// first `b_locators.len()` entries): the merged entries fill them from the front. Which
/// level gives the next entry is as likely one as the other when the keys interleave, so the
/// step picks it by arithmetic rather than by a branch the CPU would mispredict half the time;
/// only a shared key (which ends the merge) branches. The
/// write position never passes the next unread entry of `a` while `b` has entries left
/// (it trails it by the entries of `b` still to come), and once `b` is done the rest of `a`
/// is already in place. False if they share a key (`data` is then garbage).
fn merge_walk_in_place<K: Ord>(
    data: &mut [u8],
    locators: &mut [i64],
    b: &[u8],
    b_locators: &[i64],
    key: impl Fn(&[u8], usize) -> K,
) -> bool {
    let (m, total) = (b_locators.len(), locators.len());
    let (mut i, mut j, mut k) = (m, 0, 0);
    while i < total && j < m {
        let (x, y) = (key(data, i), key(b, j));
        if x == y {
            return false;
        }
        let from_a = x < y;
        let (va, vb) = (u64_at(data, i), u64_at(b, j));
        let value = if from_a { va } else { vb };
        locators[k] = if from_a { locators[i] } else { b_locators[j] };
        data[k * 8..k * 8 + 8].copy_from_slice(&value.to_le_bytes());
        k += 1;
        i += from_a as usize;
        j += !from_a as usize;
    }
    data[k * 8..(k + m - j) * 8].copy_from_slice(&b[j * 8..]);
    locators[k..k + m - j].copy_from_slice(&b_locators[j..]);
    true
}

/// `key_index.build`: one level of files' sorted images minus their deleted positions, with
/// each entry's locator; `None` when the images differ in type or a key is live twice.
pub fn build(parts: &[(Image, Option<&[u64]>)]) -> Result<Option<(Vec<u8>, Vec<i64>)>> {
    let Some((first, _)) = parts.first() else {
        return Ok(None);
    };
    for (image, _) in parts {
        if image.kind != first.kind || image.width != first.width {
            return Ok(None);
        }
        if image.len() as u64 >= 1 << POSITION_BITS {
            return Err(KernelError::unsupported("A file of 2**40 rows or more"));
        }
    }
    // Deleted positions ascending and once each (what a vector decodes to), else sorted here.
    let deleted: Vec<std::borrow::Cow<'_, [u64]>> = parts
        .iter()
        .map(|(_, d)| match d {
            None => std::borrow::Cow::Borrowed(&[][..]),
            Some(d) if d.windows(2).all(|w| w[0] < w[1]) => std::borrow::Cow::Borrowed(*d),
            Some(d) => {
                let mut sorted = d.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                std::borrow::Cow::Owned(sorted)
            }
        })
        .collect();
    let deleted: Vec<&[u64]> = deleted.iter().map(|d| d.as_ref()).collect();
    let (kind, width) = (first.kind, first.width);
    Ok(match (kind, width) {
        (Kind::Signed, 8) => build_by(parts, &deleted, |p, r| i64_at(parts[p].0.data, r)),
        (Kind::Unsigned, 8) => build_by(parts, &deleted, |p, r| u64_at(parts[p].0.data, r)),
        (Kind::Bytes, w) => build_by(parts, &deleted, |p, r| &parts[p].0.data[r * w..(r + 1) * w]),
        _ => build_by(parts, &deleted, |p, r| parts[p].0.int(r)),
    })
}

/// Up to this many parts, sorted each, [`build`] merges them head by head instead of sorting.
const MERGED_PARTS: usize = 32;

/// [`build`] over keys read by `key(part, row)`, `deleted` each part's deleted positions
/// (ascending): `None` if a key is live twice. Files' images are sorted, so a few parts are
/// merged head by head, in one pass and without a sort; many parts, or parts out of order,
/// go through a sort of every live entry.
fn build_by<K: Ord + Copy>(
    parts: &[(Image, Option<&[u64]>)],
    deleted: &[&[u64]],
    key: impl Fn(usize, usize) -> K,
) -> Option<(Vec<u8>, Vec<i64>)> {
    let sorted = |p: usize| (1..parts[p].0.len()).all(|r| key(p, r - 1) < key(p, r));
    if parts.len() <= MERGED_PARTS && (0..parts.len()).all(sorted) {
        return merge_by(parts, deleted, key);
    }
    sort_by(parts, deleted, key)
}

/// [`build_by`] of parts sorted each (strictly): the parts' live rows merged head by head.
/// The part with the smallest head goes on without another look at the others while its keys
/// stay below their heads (a compacted file and a few small ones: long stretches of one part).
fn merge_by<K: Ord + Copy>(
    parts: &[(Image, Option<&[u64]>)],
    deleted: &[&[u64]],
    key: impl Fn(usize, usize) -> K,
) -> Option<(Vec<u8>, Vec<i64>)> {
    struct Head<K> {
        part: usize,
        row: usize,
        end: usize,
        skip: usize, // the next deleted position of the part not passed yet
        key: K,
    }
    // The row moved to the next live row of part `p` from `row` on (or to `end`).
    let settle = |p: usize, row: &mut usize, end: usize, skip: &mut usize| {
        let gone = deleted[p];
        while *row < end && *skip < gone.len() && gone[*skip] as usize <= *row {
            if gone[*skip] as usize == *row {
                *row += 1;
            }
            *skip += 1;
        }
    };
    let mut heads: Vec<Head<K>> = Vec::with_capacity(parts.len());
    let mut total = 0;
    for (p, (image, _)) in parts.iter().enumerate() {
        let gone = deleted[p].iter().filter(|d| (**d as usize) < image.len()).count();
        total += image.len() - gone;
        let (mut row, mut skip) = (0, 0);
        settle(p, &mut row, image.len(), &mut skip);
        if row < image.len() {
            heads.push(Head { part: p, row, end: image.len(), skip, key: key(p, row) });
        }
    }
    let width = parts[0].0.width;
    let mut data = Vec::with_capacity(total * width);
    let mut locators = Vec::with_capacity(total);
    let mut last: Option<K> = None;
    while !heads.is_empty() {
        let mut pick = 0;
        for j in 1..heads.len() {
            if heads[j].key < heads[pick].key {
                pick = j;
            }
        }
        let bound = (0..heads.len()).filter(|j| *j != pick).map(|j| heads[j].key).min();
        let head = &mut heads[pick];
        let image = &parts[head.part].0;
        let file = (head.part as i64) << POSITION_BITS;
        loop {
            if last == Some(head.key) {
                return None; // a key live twice
            }
            last = Some(head.key);
            data.extend_from_slice(image.bytes(head.row));
            locators.push(file | head.row as i64);
            head.row += 1;
            settle(head.part, &mut head.row, head.end, &mut head.skip);
            if head.row == head.end {
                break;
            }
            head.key = key(head.part, head.row);
            if bound.is_some_and(|b| head.key >= b) {
                break;
            }
        }
        if heads[pick].row == heads[pick].end {
            heads.swap_remove(pick);
        }
    }
    Some((data, locators))
}

/// [`build_by`] through a sort: every live entry with its key and locator, sorted by key
/// with the standard library's stable sort, which finds the parts' sorted runs and merges
/// them; `None` if a key is live twice.
fn sort_by<K: Ord + Copy>(
    parts: &[(Image, Option<&[u64]>)],
    deleted: &[&[u64]],
    key: impl Fn(usize, usize) -> K,
) -> Option<(Vec<u8>, Vec<i64>)> {
    let mut entries: Vec<(K, i64)> = Vec::new();
    for (p, (image, _)) in parts.iter().enumerate() {
        let mut dropped = vec![false; image.len()];
        for &d in deleted[p] {
            if (d as usize) < image.len() {
                dropped[d as usize] = true;
            }
        }
        let file = (p as i64) << POSITION_BITS;
        entries.extend(
            dropped.iter().enumerate().filter(|(_, d)| !**d).map(|(r, _)| (key(p, r), file | r as i64)),
        );
    }
    entries.sort_by_key(|e| e.0);
    if entries.windows(2).any(|w| w[0].0 >= w[1].0) {
        return None;
    }
    let width = parts[0].0.width;
    let mut data = Vec::with_capacity(entries.len() * width);
    let mut locators = Vec::with_capacity(entries.len());
    for (_, locator) in entries {
        let (p, r) = ((locator >> POSITION_BITS) as usize, (locator & ((1 << POSITION_BITS) - 1)) as usize);
        data.extend_from_slice(parts[p].0.bytes(r));
        locators.push(locator);
    }
    Some((data, locators))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn negative_integers_sort_first() {
        let level = ints(&[-5, -1, 0, 7]);
        let keys = ints(&[-1, 3, 9, -9]);
        let level = Image::new(Kind::Signed, 8, &level).unwrap();
        let keys = Image::new(Kind::Signed, 8, &keys).unwrap();
        let (found, at) = find(&level, &keys).unwrap();
        assert_eq!(found, vec![true, false, false, false]);
        assert_eq!(at, vec![1, 3, 4, 0]);
    }

    /// Distinct sorted values drawn by a small linear congruential generator, split in two
    /// levels of `n` and `m` entries.
    fn two_levels(seed: u64, n: usize, m: usize) -> (Vec<i64>, Vec<i64>) {
        let mut state = seed;
        let mut all = std::collections::BTreeSet::new();
        while all.len() < n + m {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            all.insert((state >> 1) as i64 - (1 << 62));
        }
        let mut shuffled: Vec<i64> = all.into_iter().collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (k, v) in shuffled.drain(..).enumerate() {
            if (k * 7919 + seed as usize) % (n + m) < n && a.len() < n || b.len() >= m {
                a.push(v);
            } else {
                b.push(v);
            }
        }
        (a, b)
    }

    #[test]
    fn the_walk_and_the_gallop_merge_alike() {
        // Lengths within WALK_RATIO take the walk, the others the gallop; each result must be
        // the sorted union with each key's locator, and a shared key must fail either way.
        for (seed, n, m) in [(1, 1000, 900), (2, 5000, 100), (3, 40, 4000), (4, 0, 10), (5, 7, 0)] {
            let (a, b) = two_levels(seed, n, m);
            let a_loc: Vec<i64> = (0..a.len() as i64).collect();
            let b_loc: Vec<i64> = (0..b.len() as i64).map(|j| 1_000_000 + j).collect();
            let mut want: Vec<(i64, i64)> = a.iter().copied().zip(a_loc.iter().copied()).collect();
            want.extend(b.iter().copied().zip(b_loc.iter().copied()));
            want.sort();
            for kind in [Kind::Signed, Kind::Unsigned] {
                let flip = |v: &i64| if kind == Kind::Unsigned { (*v as u64 ^ (1 << 63)) as i64 } else { *v };
                let (ad, bd) = (ints(&a.iter().map(flip).collect::<Vec<_>>()), ints(&b.iter().map(flip).collect::<Vec<_>>()));
                let (ai, bi) = (Image::new(kind, 8, &ad).unwrap(), Image::new(kind, 8, &bd).unwrap());
                let (data, locators) = merge(&ai, &a_loc, &bi, &b_loc).unwrap().unwrap();
                assert_eq!(data, ints(&want.iter().map(|(v, _)| flip(v)).collect::<Vec<_>>()));
                assert_eq!(locators, want.iter().map(|(_, l)| *l).collect::<Vec<_>>());
                if !a.is_empty() && !b.is_empty() {
                    let mut shared = b.clone();
                    shared[b.len() / 2] = a[a.len() / 3];
                    shared.sort();
                    shared.dedup();
                    let sd = ints(&shared.iter().map(flip).collect::<Vec<_>>());
                    let si = Image::new(kind, 8, &sd).unwrap();
                    assert!(merge(&ai, &a_loc, &si, &b_loc[..shared.len()]).unwrap().is_none());
                }
            }
        }
    }

    #[test]
    fn a_key_is_live_in_a_level_unless_marked_dead() {
        // Walked (lengths alike) and searched (far apart) alike.
        for (n, keys) in [(8usize, vec![3i64, 6]), (200, vec![6])] {
            let level: Vec<i64> = (0..n as i64).collect();
            let (ld, kd) = (ints(&level), ints(&keys));
            let (li, ki) = (Image::new(Kind::Signed, 8, &ld).unwrap(), Image::new(Kind::Signed, 8, &kd).unwrap());
            let mut dead = vec![0u8; n];
            assert!(live_in(&li, &dead, &ki).unwrap());
            for k in &keys {
                dead[*k as usize] = 1;
            }
            assert!(!live_in(&li, &dead, &ki).unwrap());
            let other = ints(&[-4, n as i64 + 1]);
            assert!(!live_in(&li, &vec![0u8; n], &Image::new(Kind::Signed, 8, &other).unwrap()).unwrap());
        }
    }

    #[test]
    fn merging_levels_that_share_a_key_fails() {
        let (a, b) = (ints(&[1, 3]), ints(&[2, 3]));
        let a = Image::new(Kind::Signed, 8, &a).unwrap();
        let b = Image::new(Kind::Signed, 8, &b).unwrap();
        assert!(merge(&a, &[0, 1], &b, &[2, 3]).unwrap().is_none());
        let c = ints(&[0, 2]);
        let c = Image::new(Kind::Signed, 8, &c).unwrap();
        let (data, locators) = merge(&a, &[10, 11], &c, &[20, 21]).unwrap().unwrap();
        assert_eq!(data, ints(&[0, 1, 2, 3]));
        assert_eq!(locators, vec![20, 10, 21, 11]);
    }

    #[test]
    fn advancing_drops_removed_rows_and_merges_written_files() {
        let (base, recent) = (ints(&[1, 4, 7]), ints(&[2, 9]));
        let base = Image::new(Kind::Signed, 8, &base).unwrap();
        let recent = Image::new(Kind::Signed, 8, &recent).unwrap();
        // Rewriting key 4 (base slot 1) and key 9 (recent slot 1, so slot 3 + 1) is fine.
        let written = ints(&[4, 5, 9]);
        let written = Image::new(Kind::Signed, 8, &written).unwrap();
        let file = 2i64 << POSITION_BITS;
        let a = advance(&base, &[0, 1, 2], &[0, 0, 0], &recent, &[10, 11], &[1, 4], &[written], 2, 0);
        let expected = Advanced::Levels {
            dead: vec![0, 1, 0],
            recent: ints(&[2, 4, 5, 9]),
            recent_locators: vec![10, file, file | 1, file | 2],
        };
        assert_eq!(a.unwrap().unwrap(), expected);
        // Past its share, the recent level joins the base's live entries (key 4 is dead).
        let a = advance(&base, &[0, 1, 2], &[0, 0, 0], &recent, &[10, 11], &[1, 4], &[written], 2, 4096);
        let expected = Advanced::Base {
            base: ints(&[1, 2, 4, 5, 7, 9]),
            base_locators: vec![0, 10, file, file | 1, 2, file | 2],
        };
        assert_eq!(a.unwrap().unwrap(), expected);
        // Key 7 is live in the base, key 2 in the recent level: the index would hold them twice.
        for key in [7, 2] {
            let again = ints(&[key]);
            let again = Image::new(Kind::Signed, 8, &again).unwrap();
            assert!(advance(&base, &[0, 1, 2], &[0, 0, 0], &recent, &[10, 11], &[], &[again], 2, 0).unwrap().is_none());
        }
        let outside = advance(&base, &[0, 1, 2], &[0, 0, 0], &recent, &[10, 11], &[5], &[], 2, 0).unwrap_err();
        assert!(outside.to_string().contains("outside the index"), "{outside}");
    }

    #[test]
    fn build_drops_deleted_rows() {
        let (a, b) = (ints(&[1, 3]), ints(&[1, 2]));
        let a = Image::new(Kind::Signed, 8, &a).unwrap();
        let b = Image::new(Kind::Signed, 8, &b).unwrap();
        let deleted = [0u64];
        let (data, locators) = build(&[(a, Some(&deleted[..])), (b, None)]).unwrap().unwrap();
        assert_eq!(data, ints(&[1, 2, 3]));
        assert_eq!(locators, vec![1 << 40, (1 << 40) | 1, 1]);
        assert!(build(&[(a, None), (b, None)]).unwrap().is_none());
    }
}

