//! Tests of the memory modes, the model's geometry and the plausibility bounds (issue 18).
#![allow(clippy::unwrap_used)]
use super::geometry::{
    Attention, HybridMix, KvBytes, TensorBytes, safetensors_header_bytes, safetensors_index_bytes,
};
use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const GIB: u64 = 1024 * 1024 * 1024;

fn config(name: &str) -> &'static str {
    match name {
        "llama-3.1-8b" => include_str!("../../../testdata/models/llama-3.1-8b/config.json"),
        "qwen2-7b" => include_str!("../../../testdata/models/qwen2-7b/config.json"),
        "qwen2.5-3b" => include_str!("../../../testdata/models/qwen2.5-3b/config.json"),
        "deepseek-v2-lite" => include_str!("../../../testdata/models/deepseek-v2-lite/config.json"),
        "gemma-2-2b" => include_str!("../../../testdata/models/gemma-2-2b/config.json"),
        "mistral-7b-v0.1" => include_str!("../../../testdata/models/mistral-7b-v0.1/config.json"),
        "tiny-llama-cpu" => include_str!("../../../testdata/models/tiny-llama-cpu/config.json"),
        other => panic!("no fixture {other}"),
    }
}

fn model(name: &str) -> ModelFacts {
    ModelFacts {
        geometry: ModelGeometry::from_config_json(config(name)).unwrap(),
        weights_bytes: None,
        run_dtype: None,
        tensor_parallel_size: 1,
    }
}

fn bpt(m: &ModelFacts, cache: Option<&str>) -> Result<u64, String> {
    m.kv_bytes_per_token(cache.and_then(CacheDtype::parse))
        .map(|k: KvBytes| k.bytes_per_token)
}

#[test]
fn real_configs_give_the_bytes_vllm_uses() {
    // Qwen2-7B: the figure vLLM's own log implies on an A100 (memory-profiles.md, example 1).
    assert_eq!(bpt(&model("qwen2-7b"), Some("auto")), Ok(57_344));
    assert_eq!(bpt(&model("llama-3.1-8b"), Some("auto")), Ok(131_072));
    assert_eq!(bpt(&model("qwen2.5-3b"), None), Ok(36_864));
    // MLA: one latent of 512 + 64 per layer, not 2 × 16 heads × 192.
    let ds = model("deepseek-v2-lite");
    assert!(matches!(
        ds.geometry.attention,
        Attention::Mla {
            kv_lora_rank: 512,
            qk_rope_head_dim: 64
        }
    ));
    assert_eq!(bpt(&ds, Some("auto")), Ok(27 * 576 * 2));
    // A 4,096-token window on every layer: the same bytes per cached token.
    let mistral = model("mistral-7b-v0.1");
    assert!(matches!(
        mistral.geometry.attention,
        Attention::Standard {
            sliding_window: Some(4096),
            ..
        }
    ));
    assert_eq!(bpt(&mistral, Some("auto")), Ok(131_072));
    // Interleaved sliding and full layers: not sized, and the reason names the flag.
    let gemma = model("gemma-2-2b");
    assert_eq!(
        gemma.geometry.attention,
        Attention::Hybrid {
            mix: HybridMix::SlidingAndFull
        }
    );
    let why = bpt(&gemma, Some("auto")).unwrap_err();
    assert!(why.contains("--bytes-per-kv-token"), "{why}");
    // The tiny CPU model of ../shared/notes/real-vllm-cpu.md.
    assert_eq!(bpt(&model("tiny-llama-cpu"), Some("auto")), Ok(512));
}

#[test]
fn cache_dtype_dtype_and_tensor_parallelism_change_the_bytes() {
    let llama = model("llama-3.1-8b");
    // The fp8-KV case: half the bytes.
    for fp8 in ["fp8", "fp8_e4m3", "fp8_e5m2"] {
        assert_eq!(bpt(&llama, Some(fp8)), Ok(65_536), "{fp8}");
    }
    assert_eq!(bpt(&llama, Some("bfloat16")), Ok(131_072));
    // `--dtype float32` with cache_dtype auto: 4 bytes.
    let f32_run = ModelFacts {
        run_dtype: Some(Dtype::Float32),
        ..llama
    };
    assert_eq!(bpt(&f32_run, Some("auto")), Ok(262_144));
    // An explicit cache_dtype wins over --dtype.
    assert_eq!(bpt(&f32_run, Some("fp8")), Ok(65_536));
    // TP 2 shards 8 KV heads into 4 per GPU; TP 16 leaves one (replicated) per GPU.
    let tp = |n| ModelFacts {
        tensor_parallel_size: n,
        ..llama
    };
    assert_eq!(bpt(&tp(2), None), Ok(65_536));
    assert_eq!(bpt(&tp(16), None), Ok(2 * 32 * 128 * 2));
    // MLA latents are not sharded.
    let ds = ModelFacts {
        tensor_parallel_size: 4,
        ..model("deepseek-v2-lite")
    };
    assert_eq!(bpt(&ds, Some("fp8")), Ok(27 * 576));
    // Formats the code does not size are refused with the flag to use.
    let why = bpt(&llama, Some("nvfp4")).unwrap_err();
    assert!(why.contains("--bytes-per-kv-token"), "{why}");
    // A float32 checkpoint still runs in 16 bits under `auto`.
    let f32_ckpt = ModelGeometry::from_config_json(
        r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128, "torch_dtype": "float32"}"#,
    )
    .unwrap();
    let facts = ModelFacts {
        geometry: f32_ckpt,
        weights_bytes: None,
        run_dtype: None,
        tensor_parallel_size: 1,
    };
    assert_eq!(bpt(&facts, None), Ok(2 * 2 * 4 * 32 * 2));
}

#[test]
fn geometry_parser_reads_variants_and_says_what_is_missing() {
    let g = |s: &str| ModelGeometry::from_config_json(s);
    // Multimodal: the language model's fields under text_config win.
    let mm = g(
        r#"{"model_type": "llava", "torch_dtype": "float16", "text_config": {"num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}}"#,
    )
    .unwrap();
    assert_eq!(mm.layers, 32);
    assert_eq!(mm.dtype, Some(Dtype::Float16));
    // Newer transformers write `dtype`; GPT-2 style names; multi-query; ChatGLM's grouped heads.
    assert_eq!(
        g(r#"{"n_layer": 12, "n_head": 12, "n_embd": 768, "dtype": "bfloat16"}"#)
            .unwrap()
            .dtype,
        Some(Dtype::Bfloat16)
    );
    let mq = g(r#"{"n_layer": 24, "n_head": 16, "n_embd": 2048, "multi_query": true}"#).unwrap();
    assert!(matches!(
        mq.attention,
        Attention::Standard {
            kv_heads: 1,
            head_dim: 128,
            ..
        }
    ));
    let glm = g(
        r#"{"num_layers": 28, "num_attention_heads": 32, "hidden_size": 4096, "kv_channels": 128,
        "multi_query_attention": true, "multi_query_group_num": 2}"#,
    )
    .unwrap();
    assert!(matches!(
        glm.attention,
        Attention::Standard {
            kv_heads: 2,
            head_dim: 128,
            ..
        }
    ));
    // Qwen2 with the window in use on the upper layers only: hybrid. Mamba-style layers: hybrid.
    let qwen_window = g(
        r#"{"num_hidden_layers": 28, "num_attention_heads": 28, "hidden_size": 3584,
        "sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 21}"#,
    )
    .unwrap();
    assert_eq!(
        qwen_window.attention,
        Attention::Hybrid {
            mix: HybridMix::SlidingAndFull
        }
    );
    let layer_types = g(
        r#"{"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
        "layer_types": ["full_attention", "linear_attention"]}"#,
    )
    .unwrap();
    assert_eq!(
        layer_types.attention,
        Attention::Hybrid {
            mix: HybridMix::StateSpace
        }
    );
    let jamba = g(
        r#"{"model_type": "jamba", "num_hidden_layers": 32, "num_attention_heads": 32,
        "hidden_size": 4096}"#,
    )
    .unwrap();
    assert_eq!(
        jamba.attention,
        Attention::Hybrid {
            mix: HybridMix::StateSpace
        }
    );
    // Errors name the field.
    assert!(g("not json").is_err());
    assert!(g("[1, 2]").is_err());
    let e = g(r#"{"num_attention_heads": 32}"#).unwrap_err();
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    let e = g(r#"{"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 128}"#).unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
}

#[test]
fn safetensors_headers_and_index_give_weight_bytes() {
    let header = r#"{"__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}"#;
    let t = safetensors_header_bytes(header).unwrap();
    assert_eq!(
        t,
        TensorBytes {
            total: 32,
            float32: 16
        }
    );
    // float32 tensors halve when vLLM runs 16-bit, stay when it runs float32.
    assert_eq!(t.loaded(None), 24);
    assert_eq!(t.loaded(Some(Dtype::Float32)), 32);
    assert_eq!(t.plus(t).total, 64);
    assert!(safetensors_header_bytes(r#"{"a": {"dtype": "BF16", "data_offsets": [8, 4]}}"#).is_err());
    assert!(safetensors_header_bytes("{").is_err());
    let index = r#"{"metadata": {"total_size": 15231233024}, "weight_map": {"lm_head.weight": "x"}}"#;
    assert_eq!(safetensors_index_bytes(index), Ok(15_231_233_024));
    assert!(safetensors_index_bytes(r#"{"weight_map": {}}"#).is_err());
}

// ---- modes from cache_config_info ---------------------------------------------------------------------------

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// 30 samples at 30% KV usage over 290 s: enough history for a recommendation.
fn window() -> Vec<Observation> {
    (0..30)
        .map(|i| Observation {
            at_secs: 10.0 * i as f64,
            kv_usage: Some(0.3),
            requests_waiting: Some(0.0),
            preemptions_total: Some(0.0),
            sm_utilization: None,
        })
        .collect()
}

fn run(geometry: KvGeometry, memory: MemoryFacts) -> Outcome {
    recommend(
        &Input {
            window: &window(),
            geometry,
            memory,
            previous: None,
            compute: ComputeFacts::default(),
        },
        &Config::default(),
    )
}

/// One row of the table: the labels, what else is known, and the mode, sources and outcome expected.
struct Case {
    name: &'static str,
    labels: Vec<(&'static str, &'static str)>,
    memory: MemoryFacts,
    mode: MemoryMode,
    /// `Ok((bytes-per-token source, non-KV source))` or `Err((code, words the reason must contain))`.
    want: Result<(Source, Source), (NotYetCode, Vec<&'static str>)>,
}

/// The issue's server: a 2-layer model (512 B/token) on an 80 GiB GPU, 1 GiB of KV in 8,192 blocks of 128.
const TABLE_GEOMETRY: KvGeometry = KvGeometry {
    num_gpu_blocks: 16_384,
    block_size: 128,
    max_model_len: Some(2048),
};

#[test]
fn cache_config_combinations_table() {
    for c in cache_config_cases() {
        assert_case(&c);
    }
}

#[expect(clippy::too_many_lines, reason = "a table of cases, clearest in one place")]
fn cache_config_cases() -> Vec<Case> {
    let total = 80 * GIB;
    let gpu = MemoryFacts {
        gpu_total_bytes: Some(total),
        ..Default::default()
    };
    let with_model = MemoryFacts {
        model: Some(ModelFacts {
            weights_bytes: Some(8 * 1024 * 1024),
            ..model("tiny-llama-cpu")
        }),
        ..gpu
    };
    let measured = MemoryFacts {
        process_gpu_bytes: Some(GIB + 600 * 1024 * 1024),
        ..with_model
    };
    let kv_1gib = "1073741824";
    vec![
        Case {
            name: "budget mode, bytes from the model: the budget rule gives non-KV",
            labels: vec![
                ("gpu_memory_utilization", "0.05"),
                ("kv_cache_memory_bytes", "None"),
            ],
            memory: with_model,
            mode: MemoryMode::Budget,
            want: Ok((Source::ModelConfig, Source::VllmBudgetRule)),
        },
        Case {
            name: "budget mode, nothing about bytes per token",
            labels: vec![
                ("gpu_memory_utilization", "0.92"),
                ("num_gpu_blocks_override", "None"),
            ],
            memory: gpu,
            mode: MemoryMode::Budget,
            want: Err((
                NotYetCode::UnknownBytesPerKvToken,
                vec!["--bytes-per-kv-token", "--model-dir", "--kv-cache-memory-bytes"],
            )),
        },
        Case {
            name: "fixed KV (the issue's case 1): utilization 0.92 is not used for non-KV",
            labels: vec![
                ("gpu_memory_utilization", "0.92"),
                ("kv_cache_memory_bytes", kv_1gib),
            ],
            memory: gpu,
            mode: MemoryMode::FixedKv,
            want: Err((
                NotYetCode::UnknownNonKvMemory,
                vec![
                    "fixed-KV mode",
                    "--non-kv-memory-mib",
                    "NVML",
                    "--kv-cache-memory-bytes",
                ],
            )),
        },
        Case {
            name: "fixed KV with NVML on a dedicated GPU: measured non-KV, bytes from kv_cache_memory_bytes",
            labels: vec![
                ("gpu_memory_utilization", "0.92"),
                ("kv_cache_memory_bytes", kv_1gib),
            ],
            memory: MemoryFacts {
                process_gpu_bytes: Some(GIB + 600 * 1024 * 1024),
                ..gpu
            },
            mode: MemoryMode::FixedKv,
            want: Ok((Source::CacheConfigKvBytes, Source::MeasuredProcessMemory)),
        },
        Case {
            name: "fixed KV with --model-dir and NVML: geometry wins for bytes per token",
            labels: vec![
                ("gpu_memory_utilization", "0.9"),
                ("kv_cache_memory_bytes", kv_1gib),
            ],
            memory: measured,
            mode: MemoryMode::FixedKv,
            want: Ok((Source::ModelConfig, Source::MeasuredProcessMemory)),
        },
        Case {
            name: "fixed KV with configured non-KV",
            labels: vec![("kv_cache_memory_bytes", kv_1gib)],
            memory: MemoryFacts {
                non_kv_bytes: Some(GIB),
                ..gpu
            },
            mode: MemoryMode::FixedKv,
            want: Ok((Source::CacheConfigKvBytes, Source::Configured)),
        },
        Case {
            name: "overridden blocks (the issue's case 2): kv bytes / blocks is not bytes per token",
            labels: vec![
                ("gpu_memory_utilization", "0.92"),
                ("kv_cache_memory_bytes", kv_1gib),
                ("num_gpu_blocks_override", "16384"),
            ],
            memory: MemoryFacts {
                non_kv_bytes: Some(GIB),
                ..gpu
            },
            mode: MemoryMode::OverriddenBlocks,
            want: Err((
                NotYetCode::UnknownBytesPerKvToken,
                vec!["num_gpu_blocks_override", "--bytes-per-kv-token", "--model-dir"],
            )),
        },
        Case {
            name: "overridden blocks with the model and NVML",
            labels: vec![
                ("gpu_memory_utilization", "0.92"),
                ("num_gpu_blocks_override", "16384"),
            ],
            memory: measured,
            mode: MemoryMode::OverriddenBlocks,
            want: Ok((Source::ModelConfig, Source::MeasuredProcessMemory)),
        },
        Case {
            name: "overridden blocks: the budget rule is not used either",
            labels: vec![
                ("gpu_memory_utilization", "0.92"),
                ("num_gpu_blocks_override", "16384"),
            ],
            memory: with_model,
            mode: MemoryMode::OverriddenBlocks,
            want: Err((
                NotYetCode::UnknownNonKvMemory,
                vec!["overridden-blocks mode", "--non-kv-memory-mib"],
            )),
        },
        Case {
            name: "missing labels: an old page without any memory label",
            labels: vec![("block_size", "128"), ("num_gpu_blocks", "16384")],
            memory: with_model,
            mode: MemoryMode::Unknown,
            want: Err((
                NotYetCode::UnknownNonKvMemory,
                vec!["unknown mode", "--non-kv-memory-mib"],
            )),
        },
        Case {
            name: "missing labels, but measured: configuration and measurement suffice",
            labels: vec![],
            memory: measured,
            mode: MemoryMode::Unknown,
            want: Ok((Source::ModelConfig, Source::MeasuredProcessMemory)),
        },
        Case {
            name: "\"None\" strings everywhere are unknown, never zero",
            labels: vec![
                ("gpu_memory_utilization", "None"),
                ("kv_cache_memory_bytes", "None"),
                ("num_gpu_blocks_override", "None"),
                ("cache_dtype", "None"),
            ],
            memory: with_model,
            mode: MemoryMode::Unknown,
            want: Err((NotYetCode::UnknownNonKvMemory, vec!["unknown mode"])),
        },
        Case {
            name: "malformed and zero values are unknown too",
            labels: vec![
                ("gpu_memory_utilization", "1.7"),
                ("kv_cache_memory_bytes", "0"),
                ("num_gpu_blocks_override", "lots"),
            ],
            memory: measured,
            mode: MemoryMode::Unknown,
            want: Ok((Source::ModelConfig, Source::MeasuredProcessMemory)),
        },
    ]
}

fn assert_case(c: &Case) {
    let mem = c.memory.with_cache_config(&labels(&c.labels));
    assert_eq!(MemoryMode::of(&mem), c.mode, "{}", c.name);
    let out = run(TABLE_GEOMETRY, mem);
    match (&out, &c.want) {
        (Outcome::Ready(r), Ok((bpt_source, non_kv_source))) => {
            assert_eq!(r.bytes_per_kv_token_source, *bpt_source, "{}", c.name);
            assert_eq!(r.non_kv_source, *non_kv_source, "{}", c.name);
            if *bpt_source == Source::ModelConfig {
                assert_eq!(r.bytes_per_kv_token, 512, "{}", c.name);
            }
            // Every mode's sentence reaches the reasons.
            assert!(
                r.reasons
                    .iter()
                    .any(|x| x.message.contains(&format!("{:?} mode", c.mode))),
                "{}: {:?}",
                c.name,
                r.reasons
            );
        }
        (Outcome::NotYet { code, reason }, Err((want_code, words))) => {
            assert_eq!(code, want_code, "{}: {reason}", c.name);
            for w in words {
                assert!(reason.contains(w), "{}: `{w}` not in: {reason}", c.name);
            }
        }
        (got, want) => panic!("{}: got {got:?}, wanted {want:?}", c.name),
    }
}

#[test]
fn fixed_kv_never_derives_non_kv_from_the_utilization() {
    // The issue's numbers: an 80 GiB GPU, util 0.92 on the page, 1 GiB of fixed KV. The old budget rule said
    // non-KV = 0.92 × 80 − 1 = 72.6 GiB and recommended ~75 GiB for a model of a few MiB.
    let mem = MemoryFacts {
        gpu_total_bytes: Some(80 * GIB),
        process_gpu_bytes: Some(GIB + 500 * 1024 * 1024),
        ..Default::default()
    }
    .with_cache_config(&labels(&[
        ("gpu_memory_utilization", "0.92"),
        ("kv_cache_memory_bytes", "1073741824"),
        ("cache_dtype", "auto"),
    ]));
    let g = KvGeometry {
        num_gpu_blocks: 16_384,
        block_size: 128,
        max_model_len: Some(2048),
    };
    let r = run(g, mem).recommendation().cloned().unwrap();
    assert_eq!(r.bytes_per_kv_token, 512);
    assert_eq!(r.non_kv_bytes, 500 * 1024 * 1024);
    assert!(r.gpu_memory_mib < 2048, "{} MiB", r.gpu_memory_mib);
}

#[test]
fn the_budget_rule_on_real_numbers_with_the_models_geometry() {
    // vLLM 0.10.1.1, Qwen2-7B, A100-80GB at util 0.25: 5,867 blocks of 16 = 93,872 tokens in 5.01 GiB.
    let total = (79.25 * GIB as f64) as u64;
    let mem = MemoryFacts {
        gpu_total_bytes: Some(total),
        model: Some(model("qwen2-7b")),
        ..Default::default()
    }
    .with_cache_config(&labels(&[
        ("gpu_memory_utilization", "0.25"),
        ("kv_cache_memory_bytes", "None"),
        ("num_gpu_blocks_override", "None"),
        ("cache_dtype", "auto"),
    ]));
    let g = KvGeometry {
        num_gpu_blocks: 5867,
        block_size: 16,
        max_model_len: Some(16_384),
    };
    let r = run(g, mem).recommendation().cloned().unwrap();
    assert_eq!(r.bytes_per_kv_token, 57_344);
    assert_eq!(r.bytes_per_kv_token_source, Source::ModelConfig);
    assert_eq!(r.non_kv_source, Source::VllmBudgetRule);
    // 0.25 × 79.25 − 93,872 × 56 KiB = 14.80 GiB (the design's measured 14.81 GiB).
    let non_kv_gib = r.non_kv_bytes as f64 / GIB as f64;
    assert!((non_kv_gib - 14.80).abs() < 0.02, "{non_kv_gib}");
    // With the safetensors weights (14.25 GiB, "Model loading took 14.2488 GiB") as the floor: still fine.
    let with_weights = MemoryFacts {
        model: Some(ModelFacts {
            weights_bytes: Some((14.2488 * GIB as f64) as u64),
            ..model("qwen2-7b")
        }),
        ..mem
    };
    assert!(run(g, with_weights).recommendation().is_some());
}

#[test]
fn implausible_figures_are_not_yet_never_a_recommendation() {
    let g = KvGeometry {
        num_gpu_blocks: 1000,
        block_size: 16,
        max_model_len: None,
    };
    let base = MemoryFacts {
        gpu_total_bytes: Some(80 * GIB),
        non_kv_bytes: Some(10 * GIB),
        ..Default::default()
    };
    let code = |o: Outcome| match o {
        Outcome::NotYet { code, reason } => (code, reason),
        Outcome::Ready(r) => panic!("expected not_yet, got {r:?}"),
    };
    // Bytes per token outside physical bounds.
    for b in [3, 64 * 1024 * 1024] {
        let (c, why) = code(run(
            g,
            MemoryFacts {
                bytes_per_kv_token: Some(b),
                ..base
            },
        ));
        assert_eq!(c, NotYetCode::Implausible, "{b}: {why}");
        assert!(why.contains("bytes per KV token"), "{why}");
    }
    // The cache that runs now cannot exceed the GPU.
    let (c, why) = code(run(
        g,
        MemoryFacts {
            bytes_per_kv_token: Some(8 * 1024 * 1024),
            ..base
        },
    ));
    assert_eq!(c, NotYetCode::Implausible, "{why}");
    // Non-KV below the weights alone.
    let (c, why) = code(run(
        g,
        MemoryFacts {
            bytes_per_kv_token: Some(131_072),
            model: Some(ModelFacts {
                weights_bytes: Some(15 * GIB),
                ..model("llama-3.1-8b")
            }),
            ..base
        },
    ));
    assert_eq!(c, NotYetCode::Implausible, "{why}");
    assert!(why.contains("weights"), "{why}");
    // Weights larger than the GPU.
    let (c, _) = code(run(
        g,
        MemoryFacts {
            model: Some(ModelFacts {
                weights_bytes: Some(90 * GIB),
                ..model("llama-3.1-8b")
            }),
            non_kv_bytes: Some(79 * GIB),
            ..base
        },
    ));
    assert_eq!(c, NotYetCode::Implausible);
    // KV now + non-KV beyond the GPU.
    let (c, _) = code(run(
        g,
        MemoryFacts {
            bytes_per_kv_token: Some(4 * 1024 * 1024),
            non_kv_bytes: Some(20 * GIB),
            ..base
        },
    ));
    assert_eq!(c, NotYetCode::Implausible);
    // Fixed KV: a geometry that needs more than the bytes vLLM fitted its blocks into (TP not passed).
    let (c, why) = code(run(
        KvGeometry {
            num_gpu_blocks: 512,
            block_size: 16,
            max_model_len: None,
        },
        MemoryFacts {
            model: Some(model("llama-3.1-8b")),
            ..base
        }
        .with_cache_config(&labels(&[("kv_cache_memory_bytes", "536870912")])),
    ));
    assert_eq!(c, NotYetCode::InconsistentInputs, "{why}");
    assert!(why.contains("--tensor-parallel-size"), "{why}");
}

#[test]
fn at_the_whole_gpu_the_next_unit_is_a_replica() {
    let cfg = Config::default();
    let busy: Vec<Observation> = (0..60)
        .map(|i| Observation {
            at_secs: 10.0 * i as f64,
            kv_usage: Some(0.5),
            requests_waiting: Some(4.0),
            preemptions_total: Some(0.0),
            sm_utilization: Some(1.0),
        })
        .collect();
    let facts = ComputeFacts {
        current_share: Some(1.0),
        ttft_slo_secs: Some(1.0),
        ttft: Some(LatencyObservation {
            p95_secs: 3.0,
            samples: 500.0,
        }),
        ..Default::default()
    };
    let d = recommend_compute(&busy, &facts, None, &cfg);
    assert_eq!(d.share, 1.0);
    let codes: Vec<ReasonCode> = d.reasons.iter().map(|r| r.code).collect();
    assert!(codes.contains(&ReasonCode::ReplicaIsNextUnit), "{codes:?}");
    // No reason shows a share above a whole GPU (the old text said "grow to at least 2.00").
    assert!(
        d.reasons.iter().all(|r| !r.message.contains("2.00")),
        "{:?}",
        d.reasons
    );
    assert!(
        d.reasons[0].message.contains("= 1.00 (the whole GPU"),
        "{}",
        d.reasons[0].message
    );
    // Below the whole GPU, growth is capped at 1.00 and no replica is named.
    let f = ComputeFacts {
        current_share: Some(0.7),
        ..facts
    };
    let d = recommend_compute(&busy, &f, None, &cfg);
    assert_eq!(d.share, 1.0);
    assert!(d.reasons.iter().all(|r| r.code != ReasonCode::ReplicaIsNextUnit));
    assert!(
        d.reasons.iter().all(|r| !r.message.contains("1.40")),
        "{:?}",
        d.reasons
    );
}

// ---- the property: every mode gives not_yet with a reason, or a recommendation within physical bounds -------

fn arb_facts() -> impl Strategy<Value = (KvGeometry, MemoryFacts, Vec<(&'static str, String)>)> {
    let opt = |s: BoxedStrategy<String>| prop::option::of(prop_oneof![s, Just("None".to_string())]);
    (
        1u64..40_000,
        prop::sample::select(vec![16u64, 32, 128]),
        1u64..200,
        opt((0.01f64..=1.0).prop_map(|u| format!("{u:.2}")).boxed()),
        opt((1u64..100 * GIB).prop_map(|b| b.to_string()).boxed()),
        opt((1u64..100_000).prop_map(|b| b.to_string()).boxed()),
        prop::option::of(prop::sample::select(vec!["auto", "fp8", "bfloat16", "nvfp4"])),
        prop::option::of(prop::sample::select(vec![
            "tiny-llama-cpu",
            "qwen2-7b",
            "deepseek-v2-lite",
            "gemma-2-2b",
            "llama-3.1-8b",
        ])),
        prop::option::of(0u64..40 * GIB),
        prop::option::of(0u64..100 * GIB),
        prop::option::of(0u64..100 * GIB),
        prop::option::of(16u64..2_000_000),
    )
        .prop_map(
            |(blocks, bs, total_gib, util, kv, over, dtype, m, weights, non_kv, process, bpt)| {
                let g = KvGeometry {
                    num_gpu_blocks: blocks,
                    block_size: bs,
                    max_model_len: None,
                };
                let mem = MemoryFacts {
                    gpu_total_bytes: Some(total_gib * GIB),
                    bytes_per_kv_token: bpt,
                    non_kv_bytes: non_kv,
                    process_gpu_bytes: process,
                    model: m.map(|name| ModelFacts {
                        weights_bytes: weights,
                        ..model(name)
                    }),
                    ..Default::default()
                };
                let mut l = Vec::new();
                if let Some(u) = util {
                    l.push(("gpu_memory_utilization", u));
                }
                if let Some(k) = kv {
                    l.push(("kv_cache_memory_bytes", k));
                }
                if let Some(o) = over {
                    l.push(("num_gpu_blocks_override", o));
                }
                if let Some(d) = dtype {
                    l.push(("cache_dtype", d.to_string()));
                }
                (g, mem, l)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn every_mode_is_not_yet_with_a_reason_or_within_physical_bounds((g, mem, l) in arb_facts()) {
        let labels: BTreeMap<String, String> = l.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let mem = mem.with_cache_config(&labels);
        let mode = MemoryMode::of(&mem);
        let cfg = Config::default();
        match run(g, mem) {
            Outcome::NotYet { reason, .. } => prop_assert!(!reason.trim().is_empty()),
            Outcome::Ready(r) => {
                let total = mem.gpu_total_bytes.unwrap();
                let weights = mem.model.and_then(|m| m.weights_bytes).unwrap_or(0);
                prop_assert!(weights <= r.non_kv_bytes, "weights {weights} > non-KV {}", r.non_kv_bytes);
                prop_assert!(r.non_kv_bytes < total);
                prop_assert!((MIN_BYTES_PER_KV_TOKEN..=MAX_BYTES_PER_KV_TOKEN).contains(&r.bytes_per_kv_token));
                prop_assert!(
                    (r.kv_cache_memory_bytes + r.non_kv_bytes) as f64
                        <= cfg.max_gpu_memory_utilization * total as f64
                );
                // Only the derivations true in the mode.
                if mode != MemoryMode::Budget {
                    prop_assert_ne!(r.non_kv_source, Source::VllmBudgetRule);
                }
                if mode != MemoryMode::FixedKv {
                    prop_assert_ne!(r.bytes_per_kv_token_source, Source::CacheConfigKvBytes);
                }
            }
        }
    }
}
