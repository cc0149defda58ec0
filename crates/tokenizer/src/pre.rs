//! Which pre-tokenizer a GGUF asks for (`tokenizer.ggml.pre`), as llama.cpp
//! resolves the name: the split regexes and the per-type vocabulary switches.
//!
//! The regexes are llama.cpp's (src/llama-vocab.cpp, `llm_tokenizer_bpe`), in its
//! ECMAScript dialect; several are applied in sequence, each splitting the pieces
//! left by the one before. See [`crate::split`] for how they run.

use crate::TokenizerError;

/// Everything a `tokenizer.ggml.pre` name decides.
#[derive(Clone, Debug)]
pub(crate) struct PreSpec {
    /// The llama.cpp pre-tokenizer type the name resolves to (`LLAMA_VOCAB_PRE_TYPE_*`).
    pub kind: &'static str,
    pub regexes: &'static [&'static str],
    /// A word that is itself a token is emitted whole, without running merges.
    pub ignore_merges: bool,
    /// Detokenization drops spaces before `?!.,` and around contractions.
    pub clean_spaces: bool,
    /// Default for `add_bos_token` when the metadata does not say.
    pub add_bos: bool,
    /// This type has no BOS token by default (chatglm).
    pub no_default_bos: bool,
}

// The regexes, grouped by the types that share them.
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const JAIS2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
const DEEPSEEK3: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const GPT4O: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GRANITE_EMB_MULTI: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const PORO: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
const NEWLINES: &str = "[^\\n]+|[\\n]+";

const R_DEFAULT: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    GPT2,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];
const R_GPT2: &[&str] = &[GPT2];
const R_LLAMA3: &[&str] = &[LLAMA3];
const R_QWEN2: &[&str] = &[QWEN2];
const R_QWEN35: &[&str] = &[QWEN35];
const R_JAIS2: &[&str] = &[JAIS2];
const R_STARCODER: &[&str] = &["\\p{N}", GPT2];
const R_FALCON: &[&str] = &["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"];
const R_DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    "\\p{N}+",
];
const R_DEEPSEEK3: &[&str] = &[
    "\\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    DEEPSEEK3,
];
const R_SPARK2_5: &[&str] = &[
    "\\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
const R_YOUTU: &[&str] = &[
    "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const R_DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    "\\p{N}",
];
const R_PORO: &[&str] = &[PORO];
const R_VIKING: &[&str] = &[PORO, "\\p{N}"];
const R_TEKKEN: &[&str] = &[TEKKEN];
const R_CHAMELEON: &[&str] = &[
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    GPT2,
];
const R_GPT4O: &[&str] = &[GPT4O];
const R_GRANITE_EMB_MULTI: &[&str] = &[GRANITE_EMB_MULTI];
const R_BAILINGMOE: &[&str] = &["'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"];
const R_SEED_CODER: &[&str] = &["(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const R_UFAKZEKA: &[&str] = &["[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const R_LAGUNA: &[&str] = &[NEWLINES, QWEN2];
const R_EXAONE_MOE: &[&str] = &["(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"];
const R_MINICPM5: &[&str] = &["\\p{N}{1,3}", "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];

/// Pre-tokenizer names llama.cpp knows but hearth does not implement: they need
/// llama.cpp's bespoke splitters (kimi-k2, afmoe digits, superbpe, tiny_aya) or
/// whitespace-escaping BPE (gemma4, mmbert, sarvam-moe).
const NOT_IMPLEMENTED: &[&str] = &[
    "gemma4",
    "granite-embed-multi-311m",
    "mmbert",
    "sarvam-moe",
    "whitespace",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "kimi-k2",
    "afmoe",
];

impl PreSpec {
    /// Resolves `tokenizer.ggml.pre` the way llama.cpp's vocabulary loader does.
    /// A missing name means "default" (llama.cpp warns that quality will suffer);
    /// an unknown name is an error, as in llama.cpp.
    pub fn from_name(name: Option<&str>) -> Result<PreSpec, TokenizerError> {
        let spec = |kind, regexes| PreSpec {
            kind,
            regexes,
            ignore_merges: false,
            clean_spaces: true,
            add_bos: false,
            no_default_bos: false,
        };
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Ok(spec("default", R_DEFAULT));
        };
        if NOT_IMPLEMENTED.contains(&name) {
            return Err(TokenizerError::UnsupportedPreTokenizer(name.to_string()));
        }
        // (kind, regexes, clean_spaces, ignore_merges, add_bos)
        let (kind, regexes, clean, ignore, bos): (
            &'static str,
            &'static [&'static str],
            bool,
            bool,
            bool,
        ) = match name {
            "default" => ("default", R_DEFAULT, true, false, false),
            "minicpm5" => ("minicpm5", R_MINICPM5, true, true, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => ("llama3", R_LLAMA3, true, true, true),
            "deepseek-llm" => ("deepseek-llm", R_DEEPSEEK_LLM, false, false, false),
            "deepseek-coder" => ("deepseek-coder", R_DEEPSEEK_CODER, false, false, false),
            "deepseek-v3" => ("deepseek3-llm", R_DEEPSEEK3, false, false, false),
            "spark2_5" => ("spark2_5", R_SPARK2_5, false, false, false),
            "youtu" => ("youtu", R_YOUTU, false, true, false),
            "falcon" => ("falcon", R_FALCON, true, false, false),
            "mpt" => ("mpt", R_GPT2, true, false, false),
            "starcoder" => ("starcoder", R_STARCODER, true, false, false),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" | "exaone4" => ("gpt2", R_GPT2, true, false, false),
            "jais-2" => ("jais2", R_JAIS2, true, false, false),
            "refact" => ("refact", R_STARCODER, true, false, false),
            "command-r" => ("command-r", R_STARCODER, false, false, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => {
                ("qwen2", R_QWEN2, false, false, false)
            }
            "qwen35" => ("qwen35", R_QWEN35, false, false, false),
            "stablelm2" => ("stablelm2", R_QWEN2, true, false, false),
            "olmo" => ("olmo", R_GPT2, true, false, false),
            "dbrx" => ("dbrx", R_LLAMA3, true, false, false),
            "smaug-bpe" => ("smaug", R_LLAMA3, true, false, false),
            "poro-chat" => ("poro", R_PORO, false, false, false),
            "chatglm-bpe" => ("chatglm4", R_LLAMA3, true, false, false),
            "glm4" | "glm5" => ("chatglm4", R_LLAMA3, true, true, false),
            "viking" => ("viking", R_VIKING, false, false, false),
            "jais" => ("jais", R_GPT2, true, false, false),
            "tekken" => ("tekken", R_TEKKEN, false, true, true),
            "smollm" => ("smollm", R_STARCODER, false, false, false),
            "codeshell" => ("codeshell", R_STARCODER, true, false, false),
            "bloom" => ("bloom", R_PORO, true, false, false),
            "gpt3-finnish" => ("gpt3-finnish", R_PORO, true, false, false),
            "exaone" => ("exaone", R_STARCODER, true, false, false),
            "exaone-moe" => ("exaone-moe", R_EXAONE_MOE, true, false, false),
            "chameleon" => ("chameleon", R_CHAMELEON, false, false, true),
            "minerva-7b" => ("minerva", R_STARCODER, true, false, false),
            "megrez" => ("qwen2", R_QWEN2, true, false, false),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
                ("gpt4o", R_GPT4O, false, false, false)
            }
            "granite-embed-multi-97m" => {
                ("granite-emb-multi", R_GRANITE_EMB_MULTI, false, true, false)
            }
            "trillion" => ("trillion", R_GPT2, false, false, false),
            "granite-docling" => ("granite-docling", R_GPT2, false, false, false),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => {
                ("bailingmoe", R_BAILINGMOE, false, false, false)
            }
            "seed-coder" => ("seed-coder", R_SEED_CODER, false, false, false),
            "hunyuan" => ("hunyuan", R_QWEN2, false, false, false),
            "hunyuan-dense" => ("hunyuan-dense", R_DEEPSEEK3, false, false, false),
            "hy_v4" => ("hy_v4", R_DEEPSEEK3, false, false, false),
            "joyai-llm" => ("joyai-llm", R_DEEPSEEK3, false, false, false),
            "ufakzeka" => ("ufakzeka", R_UFAKZEKA, false, false, false),
            "grok-2" => ("grok-2", R_QWEN2, false, false, false),
            "laguna" => ("laguna", R_LAGUNA, false, false, false),
            "solar-open" => ("solar-open", R_QWEN2, false, false, false),
            "mellum2" => ("mellum2", R_STARCODER, true, false, false),
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
        };
        Ok(PreSpec {
            kind,
            regexes,
            ignore_merges: ignore,
            clean_spaces: clean,
            add_bos: bos,
            no_default_bos: kind == "chatglm4",
        })
    }
}

/// The regexes llama.cpp runs through hand-written splitters instead of
/// std::regex; [`crate::split`] matches on these exact strings, as llama.cpp does.
pub(crate) mod custom {
    pub const GPT2: &str = super::GPT2;
    pub const LLAMA3: &str = super::LLAMA3;
    /// llama.cpp also accepts the original `(?i:...)` spelling of the llama3 regex.
    pub const LLAMA3_ORIGINAL: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    pub const QWEN2: &str = super::QWEN2;
    pub const QWEN35: &str = super::QWEN35;
    pub const NEWLINES: &str = super::NEWLINES;
}
