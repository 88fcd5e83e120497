//! Deletion vectors: positions as Iceberg's `deletion-vector-v1` blob and back.
//!
//! The blob is a 4-byte big-endian length (magic and bitmap), the magic `D1 D3 39 64`, the
//! positions as a roaring bitmap in the portable 64-bit layout (`RoaringTreemap`'s
//! serialization, which is CRoaring's and so pyroaring's `BitMap64.serialize()`), and a
//! 4-byte big-endian CRC-32 of the magic and the bitmap. Bitmaps are run-optimized before
//! they are written, as pyroaring's `run_optimize()` does, to the same bytes (see
//! [`serialize`]).

use roaring::RoaringTreemap;

use crate::error::{KernelError, Result};

pub const MAGIC: [u8; 4] = [0xD1, 0xD3, 0x39, 0x64];
/// Length prefix + magic + an empty bitmap (8-byte count) + CRC.
pub const MIN_LENGTH: usize = 4 + 4 + 8 + 4;

/// The bitmap of `positions` (any order, repeats allowed).
pub fn bitmap(positions: &[u64]) -> RoaringTreemap {
    if positions.windows(2).all(|w| w[0] < w[1]) {
        // Sorted and unique (decoded vectors, one file's matches): appended in one pass.
        return RoaringTreemap::from_sorted_iter(positions.iter().copied()).unwrap_or_default();
    }
    // Sorting first and appending beats inserting each position into the containers.
    let mut sorted = positions.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    RoaringTreemap::from_sorted_iter(sorted).unwrap_or_default()
}

/// The portable serialization of `vector`, run-optimized first: the bytes pyroaring writes for
/// the same positions after `run_optimize()`.
///
/// Run containers go back to arrays or bitmaps before the optimization. A union with a vector
/// read from a blob starts from its run containers, and `optimize` keeps a run where it is as
/// big as the array it could be; from an array it keeps the array, as CRoaring does for a
/// bitmap built from positions. So the bytes depend on the positions alone, not on history.
pub fn serialize(vector: &mut RoaringTreemap) -> Vec<u8> {
    if vector.bitmaps().any(|(_, bitmap)| bitmap.statistics().n_run_containers > 0) {
        *vector = RoaringTreemap::from_bitmaps(vector.bitmaps().map(|(high, bitmap)| {
            let mut plain = bitmap.clone();
            plain.remove_run_compression();
            (high, plain)
        }));
    }
    vector.optimize();
    let mut bytes = Vec::with_capacity(vector.serialized_size());
    vector.serialize_into(&mut bytes).expect("writing to a Vec cannot fail");
    bytes
}

/// `vector` as a `deletion-vector-v1` blob.
pub fn frame(bitmap_bytes: &[u8]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(bitmap_bytes.len() + 12);
    blob.extend_from_slice(&((bitmap_bytes.len() + MAGIC.len()) as u32).to_be_bytes());
    blob.extend_from_slice(&MAGIC);
    blob.extend_from_slice(bitmap_bytes);
    let crc = crc32fast::hash(&blob[4..]);
    blob.extend_from_slice(&crc.to_be_bytes());
    blob
}

/// The blob of the union of `old` and `new` positions, and its cardinality.
pub fn encode(new: &[u64], old: Option<&[u64]>) -> (Vec<u8>, u64) {
    let mut vector = bitmap(new);
    if let Some(old) = old {
        vector |= bitmap(old);
    }
    let cardinality = vector.len();
    (frame(&serialize(&mut vector)), cardinality)
}

/// The blob of `old` (a file's current `deletion-vector-v1` blob, holding `cardinality`
/// positions) united with `new` positions, and its cardinality. The old bitmap is read and
/// united as a bitmap: a file's positions never pass through a list on the way, so the cost
/// follows the containers, not the positions the file has deleted so far.
pub fn extend(new: &[u64], old: Option<(&[u8], u64)>) -> Result<(Vec<u8>, u64)> {
    let mut vector = bitmap(new);
    if let Some((blob, cardinality)) = old {
        let before = RoaringTreemap::deserialize_unchecked_from(unframe(blob)?)
            .map_err(|e| KernelError::invalid(format!("not a portable 64-bit roaring bitmap: {e}")))?;
        if before.len() != cardinality {
            return Err(KernelError::invalid(format!(
                "it holds {} positions where its record says {cardinality}",
                before.len()
            )));
        }
        vector |= before;
    }
    let cardinality = vector.len();
    Ok((frame(&serialize(&mut vector)), cardinality))
}

/// The bitmap bytes inside a blob, after checking its length, magic and CRC; the error says
/// what is damaged (the caller names the file).
pub fn unframe(blob: &[u8]) -> Result<&[u8]> {
    if blob.len() < MIN_LENGTH {
        return Err(KernelError::invalid(format!(
            "{} bytes is too short for a deletion-vector-v1 blob",
            blob.len()
        )));
    }
    let length = u32::from_be_bytes(blob[..4].try_into().expect("4 bytes")) as usize;
    if length != blob.len() - 8 {
        return Err(KernelError::invalid(format!(
            "its length field says {length} bytes, the blob holds {}",
            blob.len() - 8
        )));
    }
    let body = &blob[4..blob.len() - 4];
    if body[..4] != MAGIC {
        let hex: String = body[..4].iter().map(|b| format!("{b:02x}")).collect();
        return Err(KernelError::invalid(format!("wrong magic {hex} (expected d1d33964)")));
    }
    let crc = u32::from_be_bytes(blob[blob.len() - 4..].try_into().expect("4 bytes"));
    if crc != crc32fast::hash(body) {
        return Err(KernelError::invalid("CRC-32 mismatch"));
    }
    Ok(&body[4..])
}

/// The positions of a portable 64-bit bitmap, ascending.
pub fn positions(bitmap_bytes: &[u8]) -> Result<Vec<u64>> {
    let vector = RoaringTreemap::deserialize_from(bitmap_bytes)
        .map_err(|e| KernelError::invalid(format!("not a portable 64-bit roaring bitmap: {e}")))?;
    Ok(vector.iter().collect())
}

/// The positions of a `deletion-vector-v1` blob, ascending. The blob's CRC-32 has been
/// checked by then, so its bitmap is read without checking each container again (roaring's
/// `deserialize_unchecked_from`, a safe function); a blob whose CRC matches but whose bitmap
/// is malformed still fails to read, with an error. The positions go into a vector sized
/// from the bitmap's cardinality.
pub fn decode(blob: &[u8]) -> Result<Vec<u64>> {
    let vector = RoaringTreemap::deserialize_unchecked_from(unframe(blob)?)
        .map_err(|e| KernelError::invalid(format!("not a portable 64-bit roaring bitmap: {e}")))?;
    let mut out = Vec::with_capacity(vector.len() as usize);
    for (high, bitmap) in vector.bitmaps() {
        let base = u64::from(high) << 32;
        out.extend(bitmap.iter().map(|low| base | u64::from(low)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extending_a_blob_equals_encoding_the_union() {
        let old: Vec<u64> = (0..5000).map(|i| i * 3).chain([1 << 33, (1 << 33) + 7]).collect();
        let new: Vec<u64> = vec![1, 3, 9_999_999, 1 << 34];
        let (old_blob, card) = encode(&old, None);
        assert_eq!(extend(&new, Some((&old_blob, card))).unwrap(), encode(&new, Some(&old)));
        assert_eq!(extend(&new, None).unwrap(), encode(&new, None));
        let wrong = extend(&new, Some((&old_blob, card + 1))).unwrap_err();
        assert!(wrong.to_string().contains("its record says"), "{wrong}");
    }

    #[test]
    fn round_trip() {
        let positions = vec![0, 1, 2, 3, 10, 1 << 33, (1 << 33) + 5];
        let (blob, cardinality) = encode(&positions, None);
        assert_eq!(cardinality, 7);
        assert_eq!(decode(&blob).unwrap(), positions);
    }

    #[test]
    fn union_with_old_positions() {
        let (blob, cardinality) = encode(&[5, 1], Some(&[1, 2]));
        assert_eq!(cardinality, 3);
        assert_eq!(decode(&blob).unwrap(), vec![1, 2, 5]);
    }

    #[test]
    fn unsorted_positions_with_repeats() {
        let (blob, cardinality) = encode(&[9, 1 << 40, 3, 9, 0], None);
        assert_eq!(cardinality, 4);
        assert_eq!(decode(&blob).unwrap(), vec![0, 3, 9, 1 << 40]);
    }

    #[test]
    fn empty_vector_is_the_minimum_length() {
        let (blob, _) = encode(&[], None);
        assert_eq!(blob.len(), MIN_LENGTH);
        assert!(decode(&blob).unwrap().is_empty());
    }

    #[test]
    fn damage_is_named() {
        let (mut blob, _) = encode(&[1, 2, 3], None);
        let last = blob.len() - 5;
        blob[last] ^= 1;
        assert_eq!(decode(&blob).unwrap_err().message, "CRC-32 mismatch");
        assert!(decode(&blob[..10]).unwrap_err().message.contains("too short"));
    }
}
