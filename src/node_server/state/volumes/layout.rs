//! How a filesystem volume keeps its data, chosen per StorageClass by the parameter `layout`
//! and kept in the volume's record: `directory` (the default: a directory on the state
//! directory's filesystem, held by a project quota where it can be) or `image` (a file of
//! exactly its size holding an ext4 of its own, on a loop device while staged, so its size
//! holds by construction on any node filesystem). A raw block volume is already an image
//! file, so the parameter does not apply to it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::node_server::state::attributes::ParameterError;

/// The StorageClass parameter.
pub const LAYOUT: &str = "layout";

/// A filesystem volume's layout. In a record: `"image"`, or absent for a directory (so
/// records from before layouts read as directories, and directories' records do not change).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    #[default]
    Directory,
    Image,
}

impl Layout {
    pub fn is_directory(&self) -> bool {
        *self == Layout::Directory
    }

    /// The parameter's value for it.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Directory => "directory",
            Layout::Image => "image",
        }
    }

    /// A StorageClass's `parameters`' `layout` (absent: a directory) for a volume of the
    /// access type asked for; any other value is refused, naming the parameter.
    pub fn from_parameters(
        map: &HashMap<String, String>,
        block: bool,
    ) -> Result<Self, ParameterError> {
        let Some(value) = map.get(LAYOUT) else {
            return Ok(Layout::Directory);
        };
        let invalid = |why| ParameterError::Invalid {
            field: "parameters",
            key: LAYOUT,
            value: value.clone(),
            why,
        };
        let layout = match value.as_str() {
            "directory" => Layout::Directory,
            "image" => Layout::Image,
            _ => return Err(invalid("must be directory or image")),
        };
        if block && layout == Layout::Image {
            return Err(invalid(
                "does not apply to a raw block volume, which is already an image file on a \
                 loop device",
            ));
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: &str) -> HashMap<String, String> {
        [(LAYOUT.to_owned(), value.to_owned())].into()
    }

    #[test]
    fn the_layout_is_a_directory_unless_the_parameter_asks_for_an_image() {
        assert_eq!(
            Layout::from_parameters(&HashMap::new(), false),
            Ok(Layout::Directory)
        );
        assert_eq!(
            Layout::from_parameters(&map("directory"), false),
            Ok(Layout::Directory)
        );
        assert_eq!(
            Layout::from_parameters(&map("image"), false),
            Ok(Layout::Image)
        );
        assert_eq!(
            Layout::from_parameters(&map("directory"), true),
            Ok(Layout::Directory)
        );
    }

    #[test]
    fn other_values_and_an_image_of_a_block_volume_are_refused_naming_the_parameter() {
        for (value, block) in [
            ("Image", false),
            ("", false),
            ("xfs", false),
            ("image", true),
        ] {
            let err = Layout::from_parameters(&map(value), block).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("parameters layout="), "{text}");
            assert!(text.contains(&format!("{value:?}")), "{text}");
        }
        let block = Layout::from_parameters(&map("image"), true).unwrap_err();
        assert!(block.to_string().contains("raw block"), "{block}");
    }

    #[test]
    fn a_record_keeps_an_image_and_reads_a_missing_layout_as_a_directory() {
        use serde_json::{from_value, json, to_value};
        assert_eq!(to_value(Layout::Image).unwrap(), json!("image"));
        assert_eq!(from_value::<Layout>(json!("image")).unwrap(), Layout::Image);
        assert!(from_value::<Layout>(json!("zfs")).is_err());
    }
}
