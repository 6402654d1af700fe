//! Decoding ring-buffer records (bytes the kernel wrote) into the shared `agent_ebpf` types.
//!
//! Pure: no I/O, so the decoding rules (kind tag, minimum length, unaligned reads) are tested
//! without a kernel.

use agent_ebpf::{
    Header, MemcgEvent, OomEvent, StallEvent, ThresholdEvent, KIND_MEMCG, KIND_OOM, KIND_STALL,
    KIND_THRESHOLD,
};

/// One decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// `oom:mark_victim`.
    Oom(OomEvent),
    /// A timed reclaim stall.
    Stall(StallEvent),
    /// An aggregated memcg event counter.
    Memcg(MemcgEvent),
    /// A watched cgroup's usage crossed its level.
    Threshold(ThresholdEvent),
}

impl Record {
    /// The common header.
    pub(crate) fn header(&self) -> &Header {
        match self {
            Record::Oom(e) => &e.header,
            Record::Stall(e) => &e.header,
            Record::Memcg(e) => &e.header,
            Record::Threshold(e) => &e.header,
        }
    }
}

/// Why a record could not be decoded (a program/agent version mismatch, never kernel input
/// we can repair).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the record's type needs.
    #[error("ring-buffer record of {got} bytes is too short for kind {kind} ({need} needed)")]
    Short {
        /// The kind tag (0 if even the header was short).
        kind: u32,
        /// Bytes received.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A kind tag this agent does not know.
    #[error("ring-buffer record has unknown kind {0}")]
    UnknownKind(u32),
}

fn read<T: Copy>(bytes: &[u8], kind: u32) -> Result<T, DecodeError> {
    let need = std::mem::size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::Short {
            kind,
            got: bytes.len(),
            need,
        });
    }
    // SAFETY: length checked above; `T` is one of the `#[repr(C)]` integer-only record types,
    // for which every bit pattern is valid; read_unaligned copes with any alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    let header: Header = read(bytes, 0)?;
    match header.kind {
        KIND_OOM => read(bytes, KIND_OOM).map(Record::Oom),
        KIND_STALL => read(bytes, KIND_STALL).map(Record::Stall),
        KIND_MEMCG => read(bytes, KIND_MEMCG).map(Record::Memcg),
        KIND_THRESHOLD => read(bytes, KIND_THRESHOLD).map(Record::Threshold),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

/// The command name in a NUL-padded `comm` array.
pub(crate) fn comm_str(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
        // SAFETY: test-only view of a plain `#[repr(C)]` value's bytes.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    #[test]
    fn decodes_each_kind_from_unaligned_bytes() {
        let stall = StallEvent {
            header: Header {
                at_ns: 5,
                cgroup_id: 42,
                kind: KIND_STALL,
                pid: 7,
            },
            duration_ns: 1000,
            memcg: 1,
            ..Default::default()
        };
        let mut buf = vec![0u8];
        buf.extend(bytes_of(&stall));
        assert_eq!(decode(&buf[1..]), Ok(Record::Stall(stall)));

        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"memhog");
        let oom = OomEvent {
            header: Header {
                kind: KIND_OOM,
                pid: 9,
                ..Default::default()
            },
            comm,
            oom_score_adj: -999,
            ..Default::default()
        };
        let Record::Oom(got) = decode(&bytes_of(&oom)).unwrap() else {
            panic!("not an OOM record");
        };
        assert_eq!(comm_str(&got.comm), "memhog");
        assert_eq!(got.oom_score_adj, -999);

        let memcg = MemcgEvent {
            header: Header {
                kind: KIND_MEMCG,
                ..Default::default()
            },
            item: 3,
            count: 64,
            ..Default::default()
        };
        assert_eq!(decode(&bytes_of(&memcg)).unwrap().header().kind, KIND_MEMCG);
    }

    #[test]
    fn short_and_unknown_records_are_errors() {
        assert_eq!(
            decode(&[0u8; 8]),
            Err(DecodeError::Short {
                kind: 0,
                got: 8,
                need: 24
            })
        );
        let header = Header {
            kind: KIND_OOM,
            ..Default::default()
        };
        assert!(matches!(
            decode(&bytes_of(&header)),
            Err(DecodeError::Short { kind: KIND_OOM, .. })
        ));
        let odd = Header {
            kind: 99,
            ..Default::default()
        };
        assert_eq!(decode(&bytes_of(&odd)), Err(DecodeError::UnknownKind(99)));
    }

    #[test]
    fn comm_stops_at_nul_and_tolerates_none() {
        assert_eq!(comm_str(b"abc\0\0\0"), "abc");
        assert_eq!(comm_str(b"abcdef"), "abcdef");
    }
}
