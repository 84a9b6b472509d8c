//! The SVG as a browser shows it: a real headless Chromium takes a screenshot at the size the
//! SVG declares, and the picture is of that size, not blank, and shows the failed step's red.

use std::path::Path;
use std::process::Command;

/// The `width` and `height` the SVG declares.
fn declared_size(svg: &str) -> (u32, u32) {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let root = doc.root_element();
    let number = |name| root.attribute(name).unwrap().parse().unwrap();
    (number("width"), number("height"))
}

/// Chromium's screenshot of `file` in a window of `size`, as RGBA pixels.
fn screenshot(file: &Path, size: (u32, u32), dir: &Path) -> (u32, u32, Vec<u8>) {
    let shot = dir.join("shot.png");
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("--window-size={},{}", size.0, size.1))
        .arg(format!("file://{}", file.display()))
        .output()
        .expect("run chromium");
    assert!(out.status.success() && shot.exists(), "chromium: {out:?}");
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let channels = info.color_type.samples();
    let rgba = pixels[..info.buffer_size()]
        .chunks(channels)
        .flat_map(|p| [p[0], p[1 % channels], p[2 % channels], 255])
        .collect();
    (info.width, info.height, rgba)
}

#[ignore = "needs chromium: Debian's package, installed by .ci/run"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_the_svg_at_its_declared_size_with_the_failed_step_in_red() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.svg");
    let out = super::kubelet_once(dir.path(), &file, true).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let svg = std::fs::read_to_string(&file).unwrap();
    let size = declared_size(&svg);
    let (width, height, rgba) = screenshot(&file, size, dir.path());
    assert_eq!(
        (width, height),
        size,
        "the screenshot is the SVG's declared size"
    );
    let pixels: Vec<&[u8]> = rgba.chunks(4).collect();
    let white = pixels.iter().filter(|p| p[..3] == [255, 255, 255]).count();
    let dark = pixels
        .iter()
        .filter(|p| p[..3].iter().all(|c| *c < 100))
        .count();
    // The failed step's red (#c62828): its arrow, its text, its step circle.
    let red = pixels
        .iter()
        .filter(|p| p[0] > 150 && p[1] < 80 && p[2] < 80)
        .count();
    let total = pixels.len();
    assert!(white > total / 2, "a white page: {white} of {total} white");
    assert!(
        dark > total / 200,
        "text and lines are drawn: {dark} of {total} dark"
    );
    assert!(red > 200, "the failed step is red: {red} red pixels");
}
