//! The SVG of real runs, parsed: what is drawn is what happened.

use std::path::Path;
use std::process::Command;

use crate::common::binary;
use crate::common::doctor::{KubeletRoot, doctor, fake_plugin, stale_socket};

/// Each arrow: (step, outcome, its whole text).
fn arrows(svg: &str) -> Vec<(String, String, String)> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    for attribute in ["width", "height", "viewBox"] {
        assert!(
            root.attribute(attribute).is_some(),
            "declares its {attribute}"
        );
    }
    for node in doc.descendants().filter(|n| n.is_element()) {
        let name = node.tag_name().name();
        assert!(
            !["script", "foreignObject", "image", "style"].contains(&name),
            "a <{name}>"
        );
        for attribute in node.attributes() {
            assert!(!attribute.name().contains("href"), "a link: {attribute:?}");
            assert!(
                !attribute.name().starts_with("on"),
                "a handler: {attribute:?}"
            );
            assert!(
                !attribute.value().contains("url(http"),
                "an outside file: {attribute:?}"
            );
        }
    }
    doc.descendants()
        .filter(|n| n.attribute("class") == Some("arrow"))
        .map(|n| {
            let title = n
                .children()
                .find(|c| c.has_tag_name("title"))
                .and_then(|t| t.text())
                .unwrap_or_default();
            (
                n.attribute("data-step").unwrap().to_owned(),
                n.attribute("data-outcome").unwrap().to_owned(),
                title.to_owned(),
            )
        })
        .collect()
}

/// Each arrow's step and what is drawn for it (its texts, the tooltip left out), joined by
/// spaces.
fn drawn(svg: &str) -> Vec<(String, String)> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.attribute("class") == Some("arrow"))
        .map(|n| {
            let texts: Vec<&str> = n
                .children()
                .filter(|c| c.has_tag_name("text"))
                .filter_map(|t| t.text())
                .collect();
            (
                n.attribute("data-step").unwrap().to_owned(),
                texts.join(" "),
            )
        })
        .collect()
}

fn lifelines(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.attribute("class") == Some("lifeline"))
        .map(|n| {
            n.descendants()
                .filter(|t| t.is_text())
                .filter_map(|t| t.text())
                .collect::<String>()
        })
        .collect()
}

fn steps(arrows: &[(String, String, String)]) -> Vec<(&str, &str)> {
    arrows
        .iter()
        .map(|(s, o, _)| (s.as_str(), o.as_str()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_svg_draws_the_lifelines_and_every_call_of_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.svg");
    let out = super::kubelet_once(dir.path(), &file, false).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let svg = std::fs::read_to_string(&file).expect("the flow was written");
    assert_eq!(
        lifelines(&svg),
        [
            "CSI driver (node-server)",
            "registrar",
            "kubelet",
            "API server (Node, CSINode)"
        ]
    );
    let arrows = arrows(&svg);
    assert_eq!(
        steps(&arrows),
        [
            ("2", "ok"),
            ("4", "ok"),
            ("5", "ok"),
            ("6", "ok"),
            ("7", "ok")
        ]
    );
    let texts: Vec<&str> = arrows.iter().map(|(_, _, t)| t.as_str()).collect();
    assert!(texts[0].contains("a-reg.sock appeared"), "{}", texts[0]);
    assert!(texts[1].starts_with("4. GetInfo ("), "timed: {}", texts[1]);
    assert!(
        texts[1].contains("CSIPlugin a.csi, endpoint "),
        "{}",
        texts[1]
    );
    assert!(
        texts[2].contains("NodeGetInfo")
            && texts[2].contains("node ID n1, max volumes 5, topology zone=z"),
        "{}",
        texts[2]
    );
    assert!(texts[3].contains("a.csi=n1"), "{}", texts[3]);
    assert!(
        texts[4].contains("NotifyRegistrationStatus(true)") && texts[4].ends_with(": registered"),
        "{}",
        texts[4]
    );
    // Drawn whole (GitHub shows no tooltips), and each call to a process names its socket.
    let shown = drawn(&svg);
    for ((step, text), (_, _, title)) in shown.iter().zip(&arrows) {
        assert!(!text.contains('…'), "step {step} cut: {text}");
        // Long words (paths) are broken across lines: compared without the breaks.
        let result = title.split_once(": ").map_or("", |(_, result)| result);
        let squeezed = |t: &str| t.split_whitespace().collect::<String>();
        assert!(
            squeezed(text).contains(&squeezed(result)),
            "step {step} lacks some of {result:?}: {text}"
        );
        let socket = match step.as_str() {
            "4" | "7" => Some("on <driver>-reg.sock"),
            "5" => Some("on csi.sock"),
            _ => None,
        };
        match socket {
            Some(socket) => assert!(text.ends_with(socket), "step {step}: {text}"),
            None => assert!(
                !text.contains(".sock on") && !text.ends_with(".sock"),
                "step {step}: {text}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_plugin_is_drawn_failed_with_the_kubelets_text() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flow.svg");
    let out = super::kubelet_once(dir.path(), &file, true).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let arrows = arrows(&std::fs::read_to_string(&file).unwrap());
    let refused: Vec<_> = arrows.iter().filter(|(_, o, _)| o == "failed").collect();
    assert_eq!(refused.len(), 1, "{arrows:?}");
    let (step, _, text) = refused[0];
    assert_eq!(step, "7");
    assert!(text.contains("NotifyRegistrationStatus(false)"), "{text}");
    assert!(text.contains("plugin validation failed"), "{text}");
    assert!(text.contains("0.3.0"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_draws_each_plugin_and_a_stale_socket_as_a_failed_step() {
    let node = KubeletRoot::new();
    let _healthy = fake_plugin(&node, "good.csi");
    stale_socket(&node.reg_socket("gone.csi"));
    let file = node.root.join("doctor.svg");
    let out = doctor(&node.root, &[&format!("--flow={}", file.display())]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let svg = std::fs::read_to_string(&file).unwrap();
    assert!(lifelines(&svg).contains(&"doctor".to_owned()));
    let arrows = arrows(&svg);
    // Two plugins of seven arrows each: the walk (2, 4, 1, 3, 5), the API (6), the notify (7).
    assert_eq!(arrows.len(), 14, "{arrows:?}");
    let stale = arrows
        .iter()
        .find(|(_, o, t)| o == "failed" && t.contains("nobody listens"));
    assert!(stale.is_some_and(|(s, _, _)| s == "2"), "{arrows:?}");
    // The calls the doctor made are timed by it; the walk stays in its order.
    let good: Vec<_> = arrows
        .iter()
        .filter(|(_, _, t)| t.contains("good.csi") || !t.contains("gone.csi"))
        .collect();
    for step in ["1", "2", "3", "4", "5"] {
        let timed = arrows.iter().filter(|(s, o, t)| {
            s == step && o != "skipped" && (t.contains(" µs") || t.contains(" ms"))
        });
        assert!(
            timed.count() >= 1,
            "step {step} carries its duration: {good:?}"
        );
    }
    let order: Vec<&str> = arrows.iter().map(|(s, _, _)| s.as_str()).collect();
    assert!(
        order
            .windows(7)
            .any(|w| w == ["2", "4", "1", "3", "5", "6", "7"]),
        "the healthy plugin's walk in its order: {order:?}"
    );
    let healthy_failed = arrows.iter().filter(|(_, o, _)| o == "failed").count();
    assert_eq!(
        healthy_failed, 1,
        "only the stale socket failed: {arrows:?}"
    );
    let notify: Vec<_> = arrows.iter().filter(|(s, _, _)| s == "7").collect();
    assert!(
        notify
            .iter()
            .all(|(_, o, t)| o == "skipped" && t.contains("read-only")),
        "{notify:?}"
    );
    assert!(
        svg.contains("plugin ")
            && svg.contains("gone.csi-reg.sock")
            && svg.contains("good.csi-reg.sock")
    );
}

#[test]
fn a_flow_file_of_another_kind_or_in_no_directory_is_refused_by_name_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry");
    let registry_flag = format!("--plugins-registry={}", registry.display());
    let missing = dir.path().join("no/such/dir/flow.svg");
    let cases: [(&[&str], String, &str); 4] = [
        (
            &["probe", "kubelet", "--once", &registry_flag],
            "flow.png".into(),
            "expected a file ending in .svg, .mmd or .md",
        ),
        (
            &["probe", "kubelet", "--once", &registry_flag],
            missing.display().to_string(),
            "cannot be written: directory",
        ),
        (
            &["probe", "doctor", "--no-api"],
            "flow.txt".into(),
            "expected a file ending in .svg, .mmd or .md",
        ),
        (
            &["demo"],
            dir.path().display().to_string() + "/d.svg/",
            "cannot be written",
        ),
    ];
    std::fs::create_dir(dir.path().join("d.svg")).unwrap();
    for (args, value, why) in cases {
        let out = Command::new(binary())
            .args(args)
            .arg(format!("--flow={value}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("invalid value \"{value}\" for flag --flow: {why}")),
            "{stderr}"
        );
    }
    assert!(
        !registry.exists(),
        "the kubelet did not start: it would have created its registry"
    );
    assert!(!Path::new(&missing).exists());
}

#[ignore = "needs root: the demo makes a private mount namespace and real mounts"]
#[test]
fn the_demo_draws_all_seven_steps_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("demo.svg");
    let out = Command::new(binary())
        .arg("demo")
        .arg(format!("--flow={}", file.display()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("the flow, drawn: {}", file.display())),
        "{stdout}"
    );
    let arrows = arrows(&std::fs::read_to_string(&file).unwrap());
    let numbers: Vec<&str> = arrows.iter().map(|(s, _, _)| s.as_str()).collect();
    assert_eq!(numbers, ["1", "2", "3", "4", "5", "6", "7"], "{arrows:?}");
    assert!(arrows.iter().all(|(_, o, _)| o == "ok"), "{arrows:?}");
}
