#!/usr/bin/env python3
"""Write the tokenizer test strings and chat conversations (stdlib only).

Usage: tokenizer_cases.py OUT.json
The reference ids are added by scripts/make_tokenizer_goldens.py, which runs
HF tokenizers/transformers on them.
"""
import json, random, sys

cases = []
def add(cat, *ss):
    for s in ss:
        cases.append({"cat": cat, "text": s})

add("whitespace", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n\n", "a b", "a  b", "a   b", "a\tb",
    "   leading", "trailing   ", " both ", "\r\n", "a\r\nb", "line1\r\nline2\r\n", "\r", "\r\r\n\n",
    " \n \n ", "x \n", "x\n ", "x  \n  y", "a\u00a0b", "\u3000x", "x\u2028y", "a\u0085b", "a\u200bb",
    "\t \t\n", "\n \n\t", "end.\n\n", "    def f():\n        return 1\n", "a" + " " * 40 + "b", " " * 100,
    "\n" * 30, "x\u2003y\u2009z", "\u00a0\u00a0", "tab\tsep\tvalues\n1\t2\t3")
add("contractions", "I'm", "I'M", "don't", "DON'T", "Don'T", "we're", "WE'RE", "We'Re", "they'll", "THEY'LL",
    "you've", "YOU'VE", "he'd", "HE'D", "it's", "IT'S", "'s", "'S", "'t", "O'Neil", "rock'n'roll",
    "'twas", "can't won't shan't", "y'all'd've", "It’s curly", "‘quoted’", "\"double\"", "'single'",
    "Ma'am", "ISN'T IT", "i'LL", "'LL'll'Ll")
add("digits", "0", "7", "42", "123", "1234567890", "3.14159", "1,000,000", "-17", "+3e10", "0x1F",
    "12345678901234567890123", "2026-11-29", "10:45:00", "v1.2.3", "٣٤٥", "१२३", "½", "²³", "Ⅻ", "①②",
    "１２３", "a1b2c3", "ABC123def456", "$19.99", "100%", "1st 2nd 3rd 4th")
add("cjk", "你好，世界", "我爱自然语言处理。", "日本語のテキストです。", "カタカナとひらがな", "한국어 문장입니다.",
    "中文English混合", "繁體中文測試", "　全角スペース", "漢字かな交じり文", "你好 world 123",
    "《三体》是刘慈欣的小说。", "Ｈｅｌｌｏ，世界！")
add("indic_marks", "नमस्ते दुनिया", "हिन्दी भाषा", "स्वागत है", "e\u0301", "a\u0308", "o\u0302\u0323",
    "สวัสดีครับ", "தமிழ் மொழி", "বাংলা ভাষা", "ਪੰਜਾਬੀ", "ગુજરાતી", "ಕನ್ನಡ", "മലയാളം", "తెలుగు",
    "Zalgo: Z\u0351\u036b\u0343a\u0310\u030al\u0350g\u0306o", "ཀུན་", "ខ្មែរ", "가")
add("rtl", "مرحبا بالعالم", "السلام عليكم", "שלום עולם", "עברית עם ניקוד: שָׁלוֹם", "\u202bRTL\u202c",
    "mixed English and العربية text", "فارسی ۱۲۳", "اردو", "\u200fמ\u200e")
add("emoji", "😀", "😀😃😄", "👨‍👩‍👧‍👦", "🇺🇸🇫🇷🇯🇵", "👍🏽", "❤️", "🏳️‍🌈", "🧑🏾‍💻 coding", "I ❤ NY",
    "✅ done", "🚀🚀🚀 launch", "emoji at end 🎉", "♀️♂️", "#️⃣ 1️⃣", "👩‍❤️‍💋‍👨", "🫠🫶")
add("decomposed", "Cafe\u0301", "cafe\u0301 au lait", "n\u0303", "A\u030a", "Ame\u0301lie", "u\u0308ber",
    "\u1100\u1161\u11a8", "Å", "Å", "ﬁ ligature", "K", "Ω", "e\u0301\u0301", "\u0301start")
add("fullwidth", "ＡＢＣ", "ｈｅｌｌｏ　ｗｏｒｌｄ", "！？。", "（括弧）", "ﾊﾝｶｸｶﾅ", "＜tag＞", "＄１００")
add("code", "def f(x):\n    return x ** 2\n", "int main() { return 0; }", "for (int i = 0; i < n; ++i) {}",
    "#include <stdio.h>\n", "std::vector<std::string> v;", "console.log(`x=${x}`);", "SELECT * FROM t WHERE a = 'b';",
    '{"key": [1, 2, {"n": null}]}', "<div class=\"a\">x</div>", "x = y if z else w  # comment",
    "fn main() -> Result<(), Box<dyn Error>> {}", "$ ls -la | grep foo > out.txt 2>&1", "a+=b; c-=d; e*=f;",
    "if __name__ == '__main__':\n\tmain()", "λx.x", "/* block */ // line", "x!=y && y>=z || !w",
    "\t\treturn;\n\t}\n}", "@decorator\nclass A(B):\n    pass", "```python\nprint('hi')\n```")
add("urls", "https://example.com", "https://example.com/path/to/page?q=1&r=two#frag",
    "http://localhost:8080/api/v1/items", "mailto:someone@example.org", "user.name+tag@mail.example.co.uk",
    "ftp://files.example.net/pub/file.tar.gz", "www.example.com/~user", "see https://x.io/a_b-c.",
    "C:\\Users\\name\\file.txt", "/usr/local/bin/python3", "git@github.com:org/repo.git")
add("special", "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "a<|endoftext|>b", "<think>x</think>",
    "<think>\n\n</think>\n\n", "<|im_start|", "<|im_start|><|im_end|>", "text <tool_call>{}</tool_call> more",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", " <|im_end|> ", "<|im_end|>\n<|im_start|>assistant\n",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|unknown|>", "<thinking>", "< think >")
prose = [
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair.",
    "Mixture-of-Experts models route each token to a few experts; the rest of the weights stay idle. "
    "That is why a 35B-parameter model can run at the speed of a 3B one, if its experts are where they "
    "are needed when they are needed.",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little and see the "
    "watery part of the world.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's first words were: \"That's one small step for "
    "[a] man, one giant leap for mankind.\" The mission lasted 8 days, 3 hours, 18 minutes and 35 seconds.",
]
add("prose", *prose)
add("prose", "\n\n".join(prose), " ".join(prose) * 3)

rng = random.Random(20261129)
pools = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
    "你好世界中文字符日本語한국어", "नमस्तेहिन्दी", "مرحباשלום", "😀👍🏽❤️🇺🇸", "éèêëàâäôöûüçñ", "\u0301\u0308\u0303",
    "ＡＢＣ１２３！", "\u00a0\u3000\u2028\u200b",
]
words = ["the", "model", "expert", "token", "GPU", "memory", "I'm", "don't", "42", "3.14", "naïve", "café", "über", "日本",
         "😀", "\n", "  ", "\t", "http://a.b/c", "x_y", "CamelCase", "ALLCAPS", "<think>", "<|im_end|>"]
for i in range(120):
    kind = i % 3
    if kind == 0:
        n = rng.randint(1, 40)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(n))
    elif kind == 1:
        s = " ".join(rng.choice(words) for _ in range(rng.randint(1, 25)))
    else:
        s = "".join(rng.choice(words) + rng.choice(["", " ", "  ", "\n", ", ", ". "]) for _ in range(rng.randint(1, 15)))
    add("random", s)

chats = []
def chat(messages, gen=True, thinking=None):
    c = {"messages": messages, "add_generation_prompt": gen}
    if thinking is not None:
        c["enable_thinking"] = thinking
    chats.append(c)

U = lambda s: {"role": "user", "content": s}
A = lambda s: {"role": "assistant", "content": s}
S = lambda s: {"role": "system", "content": s}
T = lambda s: {"role": "tool", "content": s}
chat([U("Hello!")])
chat([U("Hello!")], thinking=False)
chat([U("Hello!")], thinking=True)
chat([S("You are a helpful assistant."), U("What is 2+2?")])
chat([S("You are terse."), U("Hi"), A("Hello."), U("Tell me a joke.")])
chat([S("You are terse."), U("Hi"), A("Hello."), U("Tell me a joke.")], thinking=False)
chat([U("Q1"), A("<think>\nreasoning one\n</think>\n\nAnswer one"), U("Q2")])
chat([U("Q1"), A("<think>\nreasoning one\n</think>\n\nAnswer one")], gen=False)
chat([U("Q1"), A("Answer without think"), U("Q2"), A("<think>r2</think>A2")], gen=False)
chat([U("多语言：你好"), A("你好！有什么可以帮你？"), U("讲个笑话 😀")])
chat([S("sys"), U("u1"), S("second system"), U("u2")])
chat([U("call a tool"), A("calling"), T("{\"result\": 42}"), T("second"), U("thanks")])
chat([U("Line one\nLine two\r\n\tTabbed  spaces  ")])
chat([U("<think>user wrote a tag</think>")])
chat([U("")])
chat([S("Only a system prompt")])
chat([U("a"), A("b"), U("c"), A("d"), U("e")], thinking=False)
chat([U("x"), A("\n\nleading newlines")], gen=False)

json.dump({"cases": cases, "chats": chats}, open(sys.argv[1], "w"), ensure_ascii=False, indent=0)
print(f"{len(cases)} strings, {len(chats)} chats")
