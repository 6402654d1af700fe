//! Builds small OCI image archives for the CRI tests, since nothing can be pulled here.
//!
//! An image is one uncompressed layer with Debian's static busybox (`/bin/busybox` plus
//! `sh`/`sleep` links) and, optionally, a file of pseudo-random filler so tests can make
//! images of different sizes whose layers never dedupe against each other. The archive is an
//! OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) in a tar, which
//! `ctr images import` takes; the `io.containerd.image.name` annotation names the image.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where Debian's `busybox-static` puts its binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// What to put in a test image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestImage {
    /// Full reference, e.g. `localhost/reactor/small:1`.
    pub name: String,
    /// Bytes of pseudo-random filler at `/filler` (0 for none).
    pub filler_bytes: u64,
    /// The image's entrypoint.
    pub entrypoint: Vec<String>,
    /// The image's default arguments.
    pub cmd: Vec<String>,
    /// Files copied from the host: (host path, path in the image without the leading `/`).
    pub host_files: Vec<(PathBuf, String)>,
}

/// An image archive on disk, ready to import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltImage {
    /// The image's reference as imported.
    pub name: String,
    /// The image id the runtime reports: `sha256:` of the config blob.
    pub id: String,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// The OCI layout tar.
    pub archive: PathBuf,
    /// Size of the layer blob (uncompressed tar) in bytes.
    pub layer_bytes: u64,
    /// Total size of the blobs (config, manifest, layer), what containerd 1.6 reports as
    /// the image's size.
    pub blob_bytes: u64,
}

impl TestImage {
    /// A busybox image with `filler_bytes` of filler whose default command is a shell.
    pub fn busybox(name: &str, filler_bytes: u64) -> TestImage {
        TestImage {
            name: name.to_string(),
            filler_bytes,
            entrypoint: Vec::new(),
            cmd: vec!["/bin/sh".into()],
            host_files: Vec::new(),
        }
    }

    /// Adds a host binary at `/bin/<its name>` with the shared libraries `ldd` names for it
    /// (at the same paths), so a dynamically linked test helper such as `memhog` runs in
    /// the container.
    pub fn with_host_binary(mut self, binary: &Path) -> io::Result<TestImage> {
        let name = binary
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::other(format!("{}: no file name", binary.display())))?;
        self.host_files
            .push((binary.to_path_buf(), format!("bin/{name}")));
        let out = std::process::Command::new("ldd").arg(binary).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ldd {}: {}",
                binary.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // Lines are `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x…)`; the vDSO has no path.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = line
                .split("=>")
                .last()
                .and_then(|rest| rest.split_whitespace().next())
                .filter(|p| p.starts_with('/'));
            if let Some(path) = path {
                self.host_files.push((
                    PathBuf::from(path),
                    path.trim_start_matches('/').to_string(),
                ));
            }
        }
        Ok(self)
    }

    /// A pause image: sleeps until killed (the CRI stops sandboxes with SIGKILL).
    pub fn pause(name: &str) -> TestImage {
        TestImage {
            name: name.to_string(),
            filler_bytes: 0,
            entrypoint: vec!["/bin/sleep".into(), "2147483647".into()],
            cmd: Vec::new(),
            host_files: Vec::new(),
        }
    }

    /// Writes the image's OCI archive into `dir` and returns where it is and its digests.
    pub fn build(&self, dir: &Path) -> io::Result<BuiltImage> {
        let stem: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let layer_path = dir.join(format!("{stem}.layer.tar"));
        let (layer_digest, layer_bytes) = self.write_layer(&layer_path)?;

        let arch = oci_arch();
        let config = serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin"],
                "Entrypoint": self.entrypoint,
                "Cmd": self.cmd,
                "WorkingDir": "/",
            },
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        });
        let config = serde_json::to_vec(&config).map_err(io::Error::other)?;
        let config_digest = digest(&config);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_bytes,
            }],
        });
        let manifest = serde_json::to_vec(&manifest).map_err(io::Error::other)?;
        let manifest_digest = digest(&manifest);
        let tag = self.name.rsplit_once(':').map_or("latest", |(_, t)| t);
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest.len(),
                "platform": { "architecture": arch, "os": "linux" },
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        });
        let index = serde_json::to_vec(&index).map_err(io::Error::other)?;

        let archive = dir.join(format!("{stem}.oci.tar"));
        let mut tar = tar::Builder::new(BufWriter::new(File::create(&archive)?));
        append_bytes(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        append_bytes(&mut tar, "index.json", &index)?;
        append_bytes(&mut tar, &blob_path(&config_digest), &config)?;
        append_bytes(&mut tar, &blob_path(&manifest_digest), &manifest)?;
        let mut header = file_header(layer_bytes, 0o644);
        tar.append_data(
            &mut header,
            blob_path(&layer_digest),
            File::open(&layer_path)?,
        )?;
        tar.into_inner()?.flush()?;
        std::fs::remove_file(&layer_path)?;
        Ok(BuiltImage {
            name: self.name.clone(),
            id: config_digest,
            manifest_digest,
            archive,
            layer_bytes,
            blob_bytes: layer_bytes + config.len() as u64 + manifest.len() as u64,
        })
    }

    /// Writes the layer tar, hashing it on the way; returns its digest and size.
    fn write_layer(&self, path: &Path) -> io::Result<(String, u64)> {
        let hashing = HashingWriter {
            inner: BufWriter::new(File::create(path)?),
            hash: Sha256::new(),
            len: 0,
        };
        let mut tar = tar::Builder::new(hashing);
        for dir in ["bin", "dev", "etc", "proc", "sys", "tmp"] {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(if dir == "tmp" { 0o1777 } else { 0o755 });
            h.set_size(0);
            h.set_mtime(0);
            tar.append_data(&mut h, format!("{dir}/"), io::empty())?;
        }
        let busybox = File::open(BUSYBOX)?;
        let mut h = file_header(busybox.metadata()?.len(), 0o755);
        tar.append_data(&mut h, "bin/busybox", busybox)?;
        for applet in ["sh", "sleep", "cat", "dd", "true"] {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            h.set_mtime(0);
            tar.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
        }
        append_bytes(&mut tar, "etc/passwd", b"root:x:0:0:root:/:/bin/sh\n")?;
        let mut dirs: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for (host, at) in &self.host_files {
            // Parent directories first (the layer must not rely on the unpacker creating them).
            let mut parent = Path::new(at).parent();
            let mut chain = Vec::new();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                chain.push(p.to_string_lossy().into_owned());
                parent = p.parent();
            }
            for dir in chain.into_iter().rev() {
                if ["bin", "dev", "etc", "proc", "sys", "tmp"].contains(&dir.as_str())
                    || !dirs.insert(dir.clone())
                {
                    continue;
                }
                let mut h = tar::Header::new_ustar();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                h.set_mtime(0);
                tar.append_data(&mut h, format!("{dir}/"), io::empty())?;
            }
            let file = File::open(host)?;
            let mut h = file_header(file.metadata()?.len(), 0o755);
            tar.append_data(&mut h, at, file)?;
        }
        if self.filler_bytes > 0 {
            let mut h = file_header(self.filler_bytes, 0o644);
            let filler = Filler::new(&self.name).take(self.filler_bytes);
            tar.append_data(&mut h, "filler", filler)?;
        }
        let mut hashing = tar.into_inner()?;
        hashing.inner.flush()?;
        let hex = hex(&hashing.hash.finalize());
        Ok((format!("sha256:{hex}"), hashing.len))
    }
}

/// The OCI architecture name of this machine.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn file_header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h
}

fn append_bytes<W: Write>(tar: &mut tar::Builder<W>, path: &str, data: &[u8]) -> io::Result<()> {
    let mut h = file_header(data.len() as u64, 0o644);
    tar.append_data(&mut h, path, data)
}

fn blob_path(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Pseudo-random bytes (splitmix64) seeded by the image name: incompressible and different
/// per image, so two images never share filler blobs or snapshots.
struct Filler {
    state: u64,
}

impl Filler {
    fn new(seed: &str) -> Filler {
        let state = Sha256::digest(seed.as_bytes())[..8]
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        Filler { state }
    }
}

impl Read for Filler {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        for chunk in buf.chunks_mut(8) {
            self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
        Ok(buf.len())
    }
}

/// Reads the index back from an archive; used by the harness's own checks.
pub fn archive_entries(archive: &Path) -> io::Result<Vec<String>> {
    let mut file = File::open(archive)?;
    file.rewind()?;
    let mut tar = tar::Archive::new(file);
    tar.entries()?
        .map(|e| Ok(e?.path()?.display().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_is_an_oci_layout_whose_blobs_match_their_digests() {
        if !crate::require(Path::new(BUSYBOX).exists(), "busybox-static's /bin/busybox") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let built = TestImage::busybox("localhost/reactor/unit:7", 100_000)
            .build(dir.path())
            .unwrap();
        let mut tar = tar::Archive::new(File::open(&built.archive).unwrap());
        let mut names = Vec::new();
        let mut index = serde_json::Value::Null;
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            if let Some(hex_digest) = name.strip_prefix("blobs/sha256/") {
                assert_eq!(digest(&data), format!("sha256:{hex_digest}"), "{name}");
            }
            if name == "index.json" {
                index = serde_json::from_slice(&data).unwrap();
            }
            names.push(name);
        }
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(names.contains(&format!("blobs/sha256/{}", &built.id[7..])));
        let m = &index["manifests"][0];
        assert_eq!(m["digest"], built.manifest_digest.as_str());
        assert_eq!(
            m["annotations"]["io.containerd.image.name"],
            "localhost/reactor/unit:7"
        );
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "7");
        assert!(built.layer_bytes > 100_000);
        assert_eq!(archive_entries(&built.archive).unwrap(), names);
    }

    #[test]
    fn filler_differs_per_image_name() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        Filler::new("a").read_exact(&mut a).unwrap();
        Filler::new("b").read_exact(&mut b).unwrap();
        assert_ne!(a, b);
    }
}
