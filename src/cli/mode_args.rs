//! The flags every mode shares (`--v`, `--vmodule`, `--logging-format`, `--skip_headers`,
//! `--add_dir_header`, `--version`), and for the drop-ins of the upstream sidecars every logging
//! flag those ever registered, so that manifests written for any of their versions start. klog's (registrar v2.0–v2.10, livenessprobe v2.0–v2.11) are
//! spelled with underscores, component-base's (later versions) with dashes. Those with a
//! meaning here have it; the rest are accepted, checked as upstream checks them, and named in
//! one log line (see [`ModeArgs::ignored`]).

/// The name the multi-call binary is published under.
pub const BINARY: &str = "csi-nodekit";
/// The crate version, printed by every `--version` and reported as the CSI vendor version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// klog's flag names that have underscores; argh's names have dashes, so the command line's
/// spelling is rewritten on the way in and the help shows klog's.
pub const UNDERSCORED: &[&str] = &[
    "add_dir_header",
    "log_backtrace_at",
    "log_dir",
    "log_file",
    "log_file_max_size",
    "one_output",
    "skip_headers",
    "skip_log_headers",
];

/// Declares a mode's argument struct with the flags every mode shares appended (argh cannot
/// share fields between structs), and implements [`ModeArgs`] for it. The struct is written
/// as usual, attributes and doc comments included; a mode's own flags that are accepted for
/// compatibility and have no effect are listed after it:
/// `ignored { "--enable-pprof" => enable_pprof, ... }`. The drop-ins for the upstream sidecars
/// start with `upstream;`, which adds every logging flag those ever registered; our own modes
/// do without them (a shorter help, less code).
#[macro_export]
macro_rules! mode_args {
    (
        upstream;
        $(#[$($meta:tt)*])*
        pub struct $name:ident {
            $($fields:tt)*
        }
        $(ignored { $($flag:literal => $ignored:ident),* $(,)? })?
    ) => {
        $crate::mode_args! {
            @build [$(#[$($meta)*])*] $name
            [
                $($fields)*
                /// accepted and ignored (klog): logs always go to standard error
                #[argh(switch)]
                pub alsologtostderr: bool,
                /// accepted and ignored (klog): logs always go to standard error (default true)
                #[argh(switch)]
                pub logtostderr: bool,
                /// accepted and ignored (klog): no log files are written
                #[argh(option, arg_name = "string")]
                pub log_dir: Option<String>,
                /// accepted and ignored (klog): no log files are written
                #[argh(option, arg_name = "string")]
                pub log_file: Option<String>,
                /// accepted and ignored (klog): no log files are written (default 1800)
                #[argh(option, arg_name = "uint")]
                pub log_file_max_size: Option<u64>,
                /// accepted and ignored (klog): no log files are written
                #[argh(switch)]
                pub skip_log_headers: bool,
                /// accepted and ignored (klog): each line is written once, to standard error
                #[argh(switch)]
                pub one_output: bool,
                /// accepted and ignored (klog): every line goes to standard error (default 2)
                #[argh(option, arg_name = "value")]
                pub stderrthreshold: Option<$crate::logging::Severity>,
                /// accepted and ignored (klog): no stack traces are written (default :0)
                #[argh(option, arg_name = "value")]
                pub log_backtrace_at: Option<$crate::logging::TraceLocation>,
                /// accepted and ignored: every line is written at once (default 5s)
                #[argh(option, arg_name = "duration")]
                pub log_flush_frequency: Option<$crate::gocompat::GoDuration>,
                /// accepted and ignored: JSON lines all go to standard error
                #[argh(switch)]
                pub log_json_split_stream: bool,
                /// accepted and ignored: lines are not buffered
                #[argh(option, arg_name = "value")]
                pub log_json_info_buffer_size: Option<$crate::logging::BufferSize>,
                /// accepted and ignored: text lines all go to standard error
                #[argh(switch)]
                pub log_text_split_stream: bool,
                /// accepted and ignored: lines are not buffered
                #[argh(option, arg_name = "value")]
                pub log_text_info_buffer_size: Option<$crate::logging::BufferSize>,
            ]
            [
                "--alsologtostderr" => alsologtostderr,
                "--logtostderr" => logtostderr,
                "--log_dir" => log_dir,
                "--log_file" => log_file,
                "--log_file_max_size" => log_file_max_size,
                "--skip_log_headers" => skip_log_headers,
                "--one_output" => one_output,
                "--stderrthreshold" => stderrthreshold,
                "--log_backtrace_at" => log_backtrace_at,
                "--log-flush-frequency" => log_flush_frequency,
                "--log-json-split-stream" => log_json_split_stream,
                "--log-json-info-buffer-size" => log_json_info_buffer_size,
                "--log-text-split-stream" => log_text_split_stream,
                "--log-text-info-buffer-size" => log_text_info_buffer_size,
                $($($flag => $ignored,)*)?
            ]
        }
    };
    (
        $(#[$($meta:tt)*])*
        pub struct $name:ident {
            $($fields:tt)*
        }
        $(ignored { $($flag:literal => $ignored:ident),* $(,)? })?
    ) => {
        $crate::mode_args! {
            @build [$(#[$($meta)*])*] $name [$($fields)*] [$($($flag => $ignored,)*)?]
        }
    };
    (
        @build [$($meta:tt)*] $name:ident [$($fields:tt)*]
        [$($flag:literal => $ignored:ident,)*]
    ) => {
        // The fields pass as raw tokens: argh reads their types (a switch must be `bool`),
        // which a `ty` fragment would hide.
        $($meta)*
        pub struct $name {
            $($fields)*
            /// number for the log level verbosity: 0 is quiet, 2 adds steady-state detail, 5
            /// every call and probe
            #[argh(option, default = "0", arg_name = "value")]
            pub v: u8,
            /// comma-separated list of pattern=N settings for file-filtered logging: a pattern
            /// names a source file without .rs (supervise) or a module (registrar,
            /// probe/serve); * and ? are wildcards
            #[argh(option, default = "Default::default()", arg_name = "value")]
            pub vmodule: $crate::logging::VModule,
            /// sets the log format: text (klog) or json (component-base) (default "text")
            #[argh(option, default = "crate::logging::Format::Text", arg_name = "string")]
            pub logging_format: $crate::logging::Format,
            /// if true, adds the file directory to the header of the log messages
            #[argh(switch)]
            pub add_dir_header: bool,
            /// if true, avoid header prefixes in the log messages
            #[argh(switch)]
            pub skip_headers: bool,
            /// print the version and exit
            #[argh(switch)]
            pub version: bool,
        }

        impl $crate::cli::ModeArgs for $name {
            fn version(&self) -> bool {
                self.version
            }
            fn logging(&self) -> $crate::logging::Options {
                $crate::logging::Options {
                    verbosity: self.v,
                    vmodule: self.vmodule.clone(),
                    format: self.logging_format,
                    add_dir_header: self.add_dir_header,
                    skip_headers: self.skip_headers,
                }
            }
            fn ignored(&self) -> Vec<&'static str> {
                let given: &[(&'static str, bool)] = &[
                    $(($flag, $crate::cli::Given::given(&self.$ignored)),)*
                ];
                given.iter().filter(|(_, on)| *on).map(|(flag, _)| *flag).collect()
            }
        }
    };
}

/// Whether a flag was given: a switch that is on, an option that has a value.
pub trait Given {
    fn given(&self) -> bool;
}

impl Given for bool {
    fn given(&self) -> bool {
        *self
    }
}

impl<T> Given for Option<T> {
    fn given(&self) -> bool {
        self.is_some()
    }
}

/// What `main` needs from every mode's argument struct, beyond parsing (argh's `FromArgs`
/// and `ArgsInfo`): the flags all modes share.
pub trait ModeArgs {
    /// `--version` was given.
    fn version(&self) -> bool;
    /// The logging flags.
    fn logging(&self) -> crate::logging::Options;
    /// The flags given that are accepted for compatibility and have no effect here.
    fn ignored(&self) -> Vec<&'static str>;
}
