"""GBNF grammars (bankml/runtime/grammar) against libllama b11434's own grammar sampler: the whole
allowed-token mask at each step of seeded walks on SmolLM2's BPE and Gemma 3's SentencePiece
vocabularies, the grammars it refuses (with its messages), and allows() against mask()."""
from __future__ import annotations

import random

import numpy as np
import pytest

from bankml.errors import OracleError
from bankml.oracle.grammar import GrammarSampler
from bankml.oracle.paths import source_dir
from bankml.runtime.grammar.gbnf import GrammarError, Parser
from bankml.runtime.grammar.matcher import Grammar, for_vocab
from bankml.runtime.grammar.pieces import Pieces, decode_utf8

MODELS = ["smollm2-q4_1", "gemma3-270m-q4_k_m"]
SHIPPED = ["json", "json_arr", "arithmetic", "list", "chess", "c", "japanese", "english"]

HAND = {
    "repeat": r'root ::= [a-c]{2,4} "-" [^a-z\n]{0,3} "." . x{3} [0-9]{1,} "!"?' "\nx ::= [xy] | \"\"",
    "nested": 'root ::= ("ab" | "" | ("c" ("d" | "e" [^\\]\\-]*)*)+ ) "!" (" " root)?',
    "utf8": 'root ::= item+ "."\nitem ::= "日本語" | "ü" | [α-ω]+ | "\\u00e9" | "\\U0001F642" | " " | [^\\x00-\\x7F]',
    "any": 'root ::= . . [^"]{0,5} "\\"" .{1,3}',
    "tokens": 'root ::= "a" !<[5]> <[17]> | <[18]> "b"* | [0-9] !<[19]>{1,2} "x"',
    "empty": 'root ::= "" | "yes" | "no"',
    # odd corners the parser takes
    "digit-name": '9 ::= "a" 9?\r\nroot::=9#comment\n\n',
    "ranges": 'root ::= [a-] [-a] [z-a] | "x"{0} "b"{2,5000} [\\x41-\\x43\\]\\-\\t]',
    "nul": 'root ::= "a" [b-c]\0 | "zzz"',                 # the C string ends at the NUL
    "hyphen-name": 'root ::= ("a")+ root-1 "c"\nroot-1 ::= "b"',
}

# grammars libllama refuses, and the text of the error it logs
BAD = {
    'root ::= foo': "Undefined rule identifier 'foo'",
    'root ::= "a': "unexpected end of input",
    'root ::= [a': "unexpected end of input",
    'root := "a"': 'expecting ::= at := "a"',
    'root ::= "a" )': "expecting newline or end at )",
    'root ::= ("a"': "expecting ')' at ",
    'root ::= *': "expecting preceding item to */+/?/{ at ",
    'root ::= "a"{3001}': "number of repetitions exceeds sane defaults",
    'root ::= "a"{x}': "expecting an int at x}",
    'root ::= "a"{1,2': "expecting '}' at ",
    'root ::= "a"{1 2}': "expecting ',' at 2}",
    'root ::= "a"{99999999999999999999999}': "stoull",
    'root ::= "\\q"': "unknown escape at \\q",
    'root ::= "\\x4"': "expecting 2 hex chars at 4",
    'root ::= <[99999999999]>': "parsed token id is too big at ",
    'root ::= <[12x]>': "expecting ']' at x]>",
    'root ::= <foo': "expecting '>' at ",
    'root ::= <foo bar baz>': "invalid token '<foo bar baz>'",
    'root ::= ("a"{0,45}){45}': "number of rules that are going to be repeated",
    'root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}': "number of rules that are going",
    'root ::= "a"\n  | "b"': "expecting name at | \"b\"",
    'root ::= "a"\nbad': "expecting ::= at ",
    'root ::= "a" | root "a"': "unsupported grammar, left recursion detected for nonterminal at index 0",
    'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | empty asdf "d" | "e"\nempty ::= "blah" | ':
        "unsupported grammar, left recursion detected for nonterminal at index 0",
    'rot ::= "a"': "grammar does not contain a 'root' symbol",
    '# nothing but a comment': "failed to parse grammar",
}


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    """A model's vocabulary in bankml (pieces, tokenize) and in libllama (the oracle). The EOG ids
    come from libllama: bankml's BPE tokenizer misses the FIM ids llama.cpp adds (SmolLM2's <reponame>)."""
    from bankml.oracle.vocab import Vocab
    from bankml.testing import models
    from bankml.tokenizer import tokenizer_for
    path = models.path(request.param)
    tok, oracle = tokenizer_for(path), Vocab(path)
    pieces = [tok.piece(i, True) for i in range(tok.n_vocab)]
    eog = sorted(oracle.eog())
    fresh = Pieces(pieces, eog).decoded(None)
    struct = set(b'{}[]":,0123456789-+.eE \n\t()=*/;<>')
    kinds = {"open": fresh.ids[fresh.n_remain > 0],
             "struct": np.array([i for i, p in enumerate(pieces) if p and set(p) <= struct]),
             "short": np.array([i for i, p in enumerate(pieces) if 0 < len(p) <= 2])}

    def grammar(text: str) -> Grammar:
        return Grammar(text, pieces, eog, tokenize=lambda s: tok.encode(s, False, True))
    yield request.param, grammar, oracle, kinds, tok, eog
    oracle.close()


def _shipped(name: str) -> str:
    return (source_dir() / "grammars" / f"{name}.gbnf").read_text()


def _pick(rng: random.Random, allowed: np.ndarray, kinds: dict[str, np.ndarray]) -> int:
    """Sometimes a piece that ends inside a UTF-8 sequence, often one of punctuation and digits (to
    move through a grammar's structure), or a short one; otherwise any allowed token."""
    r = rng.random()
    for kind, upto in (("open", 0.2), ("struct", 0.6), ("short", 0.8)):
        if r < upto:
            some = np.intersect1d(allowed, kinds[kind])
            if some.size:
                return int(rng.choice(some.tolist()))
    return int(rng.choice(allowed.tolist()))


def _choose(rng: random.Random, g: Grammar, allowed: np.ndarray, kinds: dict[str, np.ndarray]) -> int | None:
    """An allowed token that accept() takes: the mask allows some that accept_token then refuses
    (see test_token_element_inside_a_piece...), and libllama would throw through its C API."""
    for _ in range(20 if allowed.size else 0):
        token = _pick(rng, allowed, kinds)
        try:
            g.clone().accept(token)
            return token
        except GrammarError:
            pass
    return None


def _walk(model, text: str, steps: int, seed: int, record, script: list[int] | None = None) -> None:
    """Compare masks (and allows()) step by step, accepting a seeded choice of allowed tokens, or
    the tokens of `script`; a clone made before each accept must follow on its own."""
    name, grammar, oracle, kinds, tok, eog = model
    ours, theirs = grammar(text), GrammarSampler(oracle, text)
    rng, same, compared, twin = random.Random(seed), 0, 0, None
    try:
        for step in range(steps):
            probe = rng.sample(range(tok.n_vocab), 48) + rng.sample(kinds["struct"].tolist(), 48) + eog
            singles = [ours.allows(t) for t in probe]       # before mask(), which allows() would reuse
            got, want = ours.mask(), theirs.mask()
            compared += 1
            same += bool(np.array_equal(got, want))
            assert np.array_equal(got, want), f"{name} step {step}: differ at ids {np.nonzero(got != want)[0][:10]}"
            assert singles == [bool(got[t]) for t in probe]
            assert twin is None or np.array_equal(twin.mask(), want)
            allowed = np.nonzero(got)[0]
            if script is None:
                token = _choose(rng, ours, allowed[~np.isin(allowed, eog)], kinds)
            else:
                token = script[step] if step < len(script) else None
            if token is None:
                break
            assert got[token], f"{name}: token {token} {tok.piece(token)!r} is refused"
            twin = ours.clone()
            twin.accept(token)                              # the clone moves on; ours must not
            assert np.array_equal(ours.mask(), want)
            ours.accept(token)
            theirs.accept(token)
    finally:
        theirs.close()
        record(kind="grammar", model=name, compared=compared, identical=same)


@pytest.mark.oracle
@pytest.mark.parametrize("gname", SHIPPED)
def test_shipped_grammar_masks_equal_llama(model, gname, record):
    _walk(model, _shipped(gname), steps=10, seed=len(gname), record=record)


@pytest.mark.oracle
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_json_walks_equal_llama(model, seed, record):
    _walk(model, _shipped("json"), steps=24, seed=seed, record=record)


@pytest.mark.oracle
def test_json_document_walk_equals_llama(model, record):
    """A document's own tokens: objects, arrays, numbers, escapes, and characters the vocabulary
    splits inside their UTF-8 sequence."""
    doc = ('{"name": "Zo\u00eb 日本 \U0001F9EC\U0001D518", "tags": [1, -2.5e3, true, {"x": null}],\n'
           '  "s": "a\\nb\\u00e9\\"", "e": [], "o": {}}')
    ids = model[4].encode(doc, add_special=False)
    _walk(model, _shipped("json"), steps=len(ids) + 1, seed=0, record=record, script=ids)


@pytest.mark.oracle
def test_token_element_inside_a_piece_is_allowed_then_refused_as_llama_does(model):
    """reject_candidates takes the rest of a piece by id once a token element is on top, but
    accept_token matches pieces char by char and drops such stacks: the piece is allowed, then
    accepting it throws (libllama's throw is not called here: it would cross the C API)."""
    name, grammar, oracle, _, tok, _ = model
    text = 'root ::= "a" !<[5]>'
    ours, theirs = grammar(text), GrammarSampler(oracle, text)
    both = np.nonzero(ours.mask() & theirs.mask())[0]
    theirs.close()
    longer = [int(t) for t in both if tok.piece(int(t)).startswith(b"a") and len(tok.piece(int(t))) > 1]
    assert longer
    with pytest.raises(GrammarError, match="Unexpected empty grammar stack after accepting piece"):
        ours.accept(longer[0])


@pytest.mark.oracle
@pytest.mark.parametrize("gname", sorted(HAND))
def test_hand_grammar_masks_equal_llama(model, gname, record):
    _walk(model, HAND[gname], steps=10, seed=len(gname) + 7, record=record)


@pytest.mark.oracle
def test_special_token_reference_equals_llama(model, record):
    """`<token>` is tokenized with parse_special: one token in one vocabulary, an error in the other."""
    name, grammar, oracle, _, _, _ = model
    special = "<|im_start|>" if name.startswith("smollm2") else "<start_of_turn>"
    _walk(model, f'root ::= {special} [a-z]+ " "? !{special}', steps=6, seed=3, record=record)
    other = "<start_of_turn>" if name.startswith("smollm2") else "<|im_start|>"
    with pytest.raises(GrammarError, match=f"invalid token '{other}'"):
        grammar(f"root ::= {other}")
    with pytest.raises(OracleError, match=f"invalid token '{other}'"):
        GrammarSampler(oracle, f"root ::= {other}")


@pytest.mark.oracle
@pytest.mark.parametrize("text", list(BAD), ids=range(len(BAD)))
def test_refuses_what_llama_refuses(model, text):
    _, grammar, oracle, _, _, _ = model
    with pytest.raises(OracleError) as theirs:
        GrammarSampler(oracle, text)
    with pytest.raises(GrammarError) as ours:
        grammar(text)
    assert BAD[text] in ours.value.what
    assert "\n" not in str(ours.value)
    if str(ours.value).startswith("parse: "):       # the parser's own line, then the grammar
        assert f"parse: error parsing grammar: {ours.value.what}\n\n{text}\n" in theirs.value.args[0]
    else:
        assert str(ours.value) in theirs.value.args[0]


def test_rejects_repetition_whose_max_is_below_its_min():
    """llama.cpp's n_opt (max - min in uint64) wraps and it makes rules until memory runs out."""
    with pytest.raises(GrammarError, match="below its minimum"):
        Grammar('root ::= "a"{3,1}', [b"a"], set())


def test_parser_rules_for_repetition():
    """S{1,3} --> S S'(2); S'(2) ::= S S'(1) |; S'(1) ::= S | (src/llama-grammar.cpp's rewrite)."""
    p = Parser()
    p.parse('root ::= "a"{1,3}')
    assert p.symbol_ids == {"root": 0, "root_1": 1, "root_2": 2}
    assert p.rules == [[(3, 97), (2, 2), (0, 0)], [(3, 97), (1, 0), (0, 0)], [(3, 97), (2, 1), (1, 0), (0, 0)]]


def test_decode_utf8_carries_a_partial_sequence():
    assert decode_utf8("日".encode()[:2], (0, 0)) == ([], (0b0110_0101_11, 1))
    assert decode_utf8("日".encode()[2:] + b"a", (0b0110_0101_11, 1)) == ([ord("日"), ord("a")], (97, 0))
    assert decode_utf8(b"a", (5, 1)) == ([], (0, -1))           # a lead byte where a continuation was due
    assert decode_utf8(b"\x80", (0, 0)) == ([], (0, -1))


def test_accept_refuses_a_token_the_grammar_rejects():
    g = Grammar('root ::= "ab"', [b"a", b"b", b"x", b"</s>"], {3})
    assert g.mask().tolist() == [True, False, False, False]
    with pytest.raises(GrammarError, match="Unexpected empty grammar stack after accepting piece: x"):
        g.accept(2)
    with pytest.raises(GrammarError, match="end of generation"):
        g.accept(3)
    g.accept(0)
    h = g.clone()
    h.accept(1)
    assert h.mask().tolist() == [False, False, False, True] and g.mask().tolist() == [False, True, False, False]


def test_for_vocab_builds_from_a_bankml_tokenizer():
    from bankml.testing import models
    from bankml.tokenizer import tokenizer_for
    tok = tokenizer_for(models.path("smollm2-q4_1"))
    g = for_vocab('root ::= <|im_start|> "x"', tok)
    ids = np.nonzero(g.mask())[0].tolist()
    assert ids == [1]
    g.accept(1)
    assert tok.piece(int(np.nonzero(g.mask())[0][0])) == b"x"


LAZY = 'root ::= "<tool_call>\\n" "{" [a-z" :,]* "}" "\\n</tool_call>"'


@pytest.mark.oracle
@pytest.mark.parametrize("text", [
    'Sure. <tool_call>\n{"a": "b"}\n</tool_call>',         # free text, then the trigger word in its own tokens
    'x<tool_call>\n{"ab"}\n</tool_call>',                  # the trigger inside a token that starts before it
    '<tool_<tool_call>\n{}\n</tool_call>',                 # a false start first
    'no call at all, <tool_ and <tool_call but no newline',
])
def test_a_lazy_grammar_equals_libllamas(model, text):
    """llama_sampler_init_grammar_lazy_patterns with a trigger word: free until the word shows in
    the text, then the grammar from the word's first byte (a token's piece cut there): masks equal
    libllama's after every token of the script."""
    from bankml.runtime.grammar.lazy import LazyGrammar
    name, grammar, oracle, kinds, tok, eog = model
    ours = LazyGrammar(grammar(LAZY), ["<tool_call>\n"])
    theirs = GrammarSampler(oracle, LAZY, triggers=("<tool_call>\n",))
    try:
        for step, token in enumerate(tok.encode(text, False, True)):
            got, want = ours.mask(), theirs.mask()
            assert np.array_equal(got, want), f"{name} step {step}: differ at ids {np.nonzero(got != want)[0][:10]}"
            assert ours.allows(token) == bool(want[token])
            ours.accept(token)
            theirs.accept(token)
        got, want = ours.mask(), theirs.mask()
        assert np.array_equal(got, want)
        assert ours.awaiting == ("<tool_call>\n" not in text)
        if not ours.awaiting:
            assert want.sum() < len(want) // 2      # the grammar holds now
    finally:
        theirs.close()
