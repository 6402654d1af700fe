//! Just enough of a BTF reader to find struct member offsets and enum values in the kernel's
//! own type information (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF has no CO-RE relocations, so the kernel facts the programs need (where
//! `task_struct.cgroups` is, which `vm_event_item` number is `PGSCAN_DIRECT`) are looked up
//! here at load time and handed to the programs as globals and map entries — never
//! hard-coded per kernel version.

use std::collections::HashMap;

/// Where the running kernel publishes its BTF (Linux 5.4+ with `CONFIG_DEBUG_INFO_BTF`).
pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why BTF could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum BtfError {
    /// The blob does not start with the BTF magic.
    #[error("not BTF: bad magic {0:#06x}")]
    BadMagic(u16),
    /// A header or section runs past the end of the blob.
    #[error("BTF truncated: {0}")]
    Truncated(&'static str),
    /// A type of a kind this reader does not know; its size cannot be skipped.
    #[error("BTF type #{id} has unknown kind {kind}")]
    UnknownKind {
        /// The type id.
        id: u32,
        /// The kind number.
        kind: u32,
    },
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
struct Member {
    name: String,
    type_id: u32,
    bit_offset: u32,
}

#[derive(Debug, Clone)]
enum Type {
    Composite {
        members: Vec<Member>,
    },
    Enum {
        values: Vec<(String, i64)>,
    },
    /// Typedef, const, volatile, restrict, type tag: refers to another type.
    Alias {
        type_id: u32,
    },
    Other,
}

/// A parsed BTF blob: named structs/unions and enums, with their members and values.
#[derive(Debug, Default)]
pub(crate) struct Btf {
    types: Vec<Type>,
    by_name: HashMap<String, Vec<u32>>,
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    let b = data.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn str_at(strings: &[u8], off: u32) -> String {
    let Some(rest) = strings.get(off as usize..) else {
        return String::new();
    };
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end]).into_owned()
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub(crate) fn from_kernel() -> std::io::Result<Result<Btf, BtfError>> {
        let data = std::fs::read(VMLINUX_BTF)?;
        Ok(Btf::parse(&data))
    }

    /// Parses a little-endian BTF blob (the kernel's, or one a test builds).
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        let magic = data
            .get(0..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or(BtfError::Truncated("header"))?;
        if magic != 0xeb9f {
            return Err(BtfError::BadMagic(magic));
        }
        let field = |at| u32_at(data, at).ok_or(BtfError::Truncated("header"));
        let hdr_len = field(4)? as usize;
        let (type_off, type_len) = (field(8)? as usize, field(12)? as usize);
        let (str_off, str_len) = (field(16)? as usize, field(20)? as usize);
        let types_data = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Truncated("type section"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Truncated("string section"))?;

        // Type id 0 is `void`.
        let mut btf = Btf {
            types: vec![Type::Other],
            by_name: HashMap::new(),
        };
        let mut at = 0;
        while at < types_data.len() {
            let id = btf.types.len() as u32;
            let rd = |off: usize| u32_at(types_data, at + off).ok_or(BtfError::Truncated("type"));
            let (name_off, info, size_or_type) = (rd(0)?, rd(4)?, rd(8)?);
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            at += 12;
            let rd = |off: usize| u32_at(types_data, at + off).ok_or(BtfError::Truncated("type"));
            let ty = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => {
                    at += 4;
                    Type::Other
                }
                KIND_PTR | KIND_FWD | KIND_FUNC | KIND_FLOAT => Type::Other,
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Type::Alias {
                        type_id: size_or_type,
                    }
                }
                KIND_ARRAY => {
                    at += 12;
                    Type::Other
                }
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let (m_name, m_type, m_off) =
                            (rd(i * 12)?, rd(i * 12 + 4)?, rd(i * 12 + 8)?);
                        let bit_offset = if kind_flag {
                            m_off & 0x00ff_ffff
                        } else {
                            m_off
                        };
                        members.push(Member {
                            name: str_at(strings, m_name),
                            type_id: m_type,
                            bit_offset,
                        });
                    }
                    at += vlen * 12;
                    Type::Composite { members }
                }
                KIND_ENUM => {
                    let mut values = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let (v_name, v) = (rd(i * 8)?, rd(i * 8 + 4)?);
                        let v = if kind_flag {
                            i64::from(v as i32)
                        } else {
                            i64::from(v)
                        };
                        values.push((str_at(strings, v_name), v));
                    }
                    at += vlen * 8;
                    Type::Enum { values }
                }
                KIND_ENUM64 => {
                    let mut values = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let (v_name, lo, hi) = (rd(i * 12)?, rd(i * 12 + 4)?, rd(i * 12 + 8)?);
                        values.push((
                            str_at(strings, v_name),
                            ((u64::from(hi) << 32) | u64::from(lo)) as i64,
                        ));
                    }
                    at += vlen * 12;
                    Type::Enum { values }
                }
                KIND_FUNC_PROTO => {
                    at += vlen * 8;
                    Type::Other
                }
                KIND_DATASEC => {
                    at += vlen * 12;
                    Type::Other
                }
                kind => return Err(BtfError::UnknownKind { id, kind }),
            };
            if matches!(ty, Type::Composite { .. } | Type::Enum { .. }) && name_off != 0 {
                btf.by_name
                    .entry(str_at(strings, name_off))
                    .or_default()
                    .push(id);
            }
            btf.types.push(ty);
        }
        Ok(btf)
    }

    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            match self.types.get(id as usize)? {
                Type::Alias { type_id } => id = *type_id,
                ty => return Some(ty),
            }
        }
        None
    }

    /// Byte offset of `member` in the struct or union named `name`, looking through anonymous
    /// struct/union members as C does. `None` if absent or a bitfield.
    pub(crate) fn member_offset(&self, name: &str, member: &str) -> Option<u64> {
        self.by_name.get(name)?.iter().find_map(|&id| {
            let bits = self.member_bits(id, member, 0)?;
            (bits % 8 == 0).then_some(u64::from(bits / 8))
        })
    }

    fn member_bits(&self, id: u32, member: &str, depth: u32) -> Option<u32> {
        let Some(Type::Composite { members }) = self.resolve(id) else {
            return None;
        };
        if depth > 8 {
            return None;
        }
        if let Some(m) = members.iter().find(|m| m.name == member) {
            return Some(m.bit_offset);
        }
        members
            .iter()
            .filter(|m| m.name.is_empty())
            .find_map(|m| Some(m.bit_offset + self.member_bits(m.type_id, member, depth + 1)?))
    }

    /// The value of `variant` in the enum named `name` (an anonymous enum when `name` is "").
    pub(crate) fn enum_value(&self, name: &str, variant: &str) -> Option<i64> {
        self.by_name.get(name)?.iter().find_map(|&id| {
            let Some(Type::Enum { values }) = self.types.get(id as usize) else {
                return None;
            };
            values.iter().find(|(n, _)| n == variant).map(|(_, v)| *v)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: `struct outer { int a; union { long b; }; }` and
    /// `enum colour { RED = 0, BLUE = 7 }`, with a typedef in between.
    fn sample() -> Vec<u8> {
        let strings = b"\0outer\0a\0b\0colour\0RED\0BLUE\0int\0".to_vec();
        let s = |name: &str| -> u32 {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut t = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                t.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: int
        push(&[s("int"), KIND_INT << 24, 4, 32]);
        // 2: anonymous union { long b at 0 }
        push(&[0, (KIND_UNION << 24) | 1, 8, s("b"), 1, 0]);
        // 3: typedef -> 2
        push(&[0, KIND_TYPEDEF << 24, 2]);
        // 4: struct outer { int a @0; <anon> @64 (via typedef 3) }
        push(&[
            s("outer"),
            (KIND_STRUCT << 24) | 2,
            16,
            s("a"),
            1,
            0,
            0,
            3,
            64,
        ]);
        // 5: enum colour
        push(&[
            s("colour"),
            (KIND_ENUM << 24) | 2,
            4,
            s("RED"),
            0,
            s("BLUE"),
            7,
        ]);
        let mut blob = Vec::new();
        for w in [
            0xeb9f_u32 | (1 << 16),
            24,
            0,
            t.len() as u32,
            t.len() as u32,
        ] {
            blob.extend_from_slice(&w.to_le_bytes());
        }
        blob.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        blob.extend_from_slice(&t);
        blob.extend_from_slice(&strings);
        blob
    }

    #[test]
    fn finds_members_through_anonymous_unions() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Some(0));
        assert_eq!(btf.member_offset("outer", "b"), Some(8));
        assert_eq!(btf.member_offset("outer", "c"), None);
        assert_eq!(btf.member_offset("inner", "a"), None);
    }

    #[test]
    fn finds_enum_values_by_name() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.enum_value("colour", "BLUE"), Some(7));
        assert_eq!(btf.enum_value("colour", "GREEN"), None);
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert_eq!(
            Btf::parse(b"\x00\x01").unwrap_err(),
            BtfError::BadMagic(0x0100)
        );
        let blob = sample();
        assert!(matches!(
            Btf::parse(&blob[..blob.len() - 4]),
            Err(BtfError::Truncated(_))
        ));
        assert!(Btf::parse(&[]).is_err());
    }

    #[test]
    fn reads_the_running_kernel_when_it_has_btf() {
        let Ok(Ok(btf)) = Btf::from_kernel() else {
            eprintln!("skipping: no readable {VMLINUX_BTF}");
            return;
        };
        assert!(btf.member_offset("task_struct", "cgroups").is_some());
        assert!(btf
            .enum_value("cgroup_subsys_id", "memory_cgrp_id")
            .is_some());
        assert!(btf.enum_value("vm_event_item", "PGSCAN_DIRECT").is_some());
    }
}
