//! Resource lists: a resource name mapped to an exact quantity.
//!
//! The kubelet's `v1.ResourceList` is a map from name to `resource.Quantity`; the rules that
//! read it care about the difference between "absent" and "zero" (QoS, cgroup limits), so this
//! keeps entries as present-or-absent rather than defaulting to zero. A pod has a handful of
//! entries, so a sorted vector beats a map for both memory and lookup speed.

use super::quantity::Quantity;

/// The `cpu` resource (cores; compared in millicores).
pub(crate) const CPU: &str = "cpu";
/// The `memory` resource (bytes).
pub(crate) const MEMORY: &str = "memory";
/// The `ephemeral-storage` resource (bytes of local disk).
pub(crate) const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// The `pods` resource: every pod requests exactly one.
pub(crate) const PODS: &str = "pods";
/// Prefix of the huge page resources (`hugepages-2Mi`, ...).
pub(crate) const HUGEPAGES_PREFIX: &str = "hugepages-";

/// A set of named quantities, sorted by name; absent and zero are different things.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceList {
    entries: Vec<(String, Quantity)>,
}

impl ResourceList {
    /// An empty list (no resource named at all).
    pub const fn new() -> Self {
        ResourceList {
            entries: Vec::new(),
        }
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    /// The quantity named, if the list names it.
    pub fn get(&self, name: &str) -> Option<Quantity> {
        self.position(name).ok().map(|i| self.entries[i].1)
    }

    /// The quantity named, or zero when absent (how Go reads a missing map key).
    pub(crate) fn get_or_zero(&self, name: &str) -> Quantity {
        self.get(name).unwrap_or(Quantity::ZERO)
    }

    /// Whether the list names the resource (even with a zero quantity).
    #[cfg(test)]
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    /// The cpu quantity, if present.
    #[cfg(test)]
    pub(crate) fn cpu(&self) -> Option<Quantity> {
        self.get(CPU)
    }

    /// The memory quantity, if present.
    #[cfg(test)]
    pub(crate) fn memory(&self) -> Option<Quantity> {
        self.get(MEMORY)
    }

    /// Sets `name` to `quantity`, replacing any earlier value.
    pub fn set(&mut self, name: &str, quantity: Quantity) {
        match self.position(name) {
            Ok(i) => self.entries[i].1 = quantity,
            Err(i) => self.entries.insert(i, (name.to_string(), quantity)),
        }
    }

    /// Adds `quantity` to `name`, creating the entry when absent.
    pub(crate) fn add(&mut self, name: &str, quantity: Quantity) {
        match self.position(name) {
            Ok(i) => self.entries[i].1 = self.entries[i].1.saturating_add(quantity),
            Err(i) => self.entries.insert(i, (name.to_string(), quantity)),
        }
    }

    /// Adds every entry of `other` (the kubelet's `addResourceList`).
    pub(crate) fn add_all(&mut self, other: &ResourceList) {
        for (name, q) in &other.entries {
            self.add(name, *q);
        }
    }

    /// Raises each entry to the one in `other` where that is larger, creating absent ones
    /// (the kubelet's `maxResourceList`).
    pub(crate) fn max_all(&mut self, other: &ResourceList) {
        for (name, q) in &other.entries {
            match self.position(name) {
                Ok(i) => {
                    if *q > self.entries[i].1 {
                        self.entries[i].1 = *q;
                    }
                }
                Err(i) => self.entries.insert(i, (name.clone(), *q)),
            }
        }
    }

    /// The entries, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Quantity)> + '_ {
        self.entries.iter().map(|(n, q)| (n.as_str(), *q))
    }

    /// How many resources the list names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the list names no resource at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl FromIterator<(String, Quantity)> for ResourceList {
    fn from_iter<I: IntoIterator<Item = (String, Quantity)>>(iter: I) -> Self {
        let mut list = ResourceList::new();
        for (name, q) in iter {
            list.set(&name, q);
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn absent_differs_from_zero() {
        let mut l = ResourceList::new();
        assert_eq!(l.get(CPU), None);
        l.set(CPU, Quantity::ZERO);
        assert_eq!(l.get(CPU), Some(Quantity::ZERO));
        assert!(l.contains(CPU));
        assert_eq!(l.get_or_zero(MEMORY), Quantity::ZERO);
    }

    #[test]
    fn add_and_max_follow_the_kubelet_helpers() {
        let mut a: ResourceList = [(CPU.to_string(), q("1")), (MEMORY.to_string(), q("1Gi"))]
            .into_iter()
            .collect();
        let b: ResourceList = [(CPU.to_string(), q("500m")), ("pods".to_string(), q("1"))]
            .into_iter()
            .collect();
        let mut sum = a.clone();
        sum.add_all(&b);
        assert_eq!(sum.cpu(), Some(q("1500m")));
        assert_eq!(sum.get("pods"), Some(q("1")));
        a.max_all(&b);
        assert_eq!(a.cpu(), Some(q("1")));
        assert_eq!(a.get("pods"), Some(q("1")));
        let names: Vec<&str> = a.iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["cpu", "memory", "pods"]);
    }
}
