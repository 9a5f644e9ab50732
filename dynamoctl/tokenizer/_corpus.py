"""Training text for the builtin tokenizer: written here, not read from the machine.

The corpus is data, so this module is mostly text. It lives in the source tree (rather than
being read from, say, the interpreter's standard library) so that a rebuild gives the same
tokenizer on any Python version and any machine: token ids of the builtin tokenizer show up
in golden tests and benchmarks, and must not drift with whoever ran the build.

Mix: English prose of the kind users send to a chat model, a list of common English words
(expanded into pseudo-sentences with Zipf-like frequencies, so frequent words become single
tokens), source code and data formats, numbers, and text in other scripts and emoji (so
non-Latin text gets some merges instead of only raw bytes; any input round-trips anyway,
since the tokenizer is byte-level).
"""

# Look-alike characters (fullwidth comma, Greek capitals, curly quotes) are the point here.
# ruff: noqa: RUF001

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import accumulate

PROSE = """\
Large language models are served by engines that keep the attention keys and values of every
request in a paged cache on the GPU. When two requests share a prefix, such as the same system
prompt or the same document, the engine can reuse the cached blocks instead of computing them
again. A router that knows which worker already holds a prefix can send the request there, and
the time to first token drops because the prefill is shorter.

The frontend accepts requests in the OpenAI format, applies the model's chat template, turns the
prompt into token ids and streams the generated text back as server-sent events. Each worker
runs one engine, publishes events when it stores or evicts cache blocks, and reports its load:
how many requests are running, how many are waiting, and how full its cache is.

Prefill and decode have different costs. Prefill processes the whole prompt at once and is bound
by compute; decode produces one token per step for every running request and is bound by memory
bandwidth. Disaggregated serving runs them on different workers and moves the cache between them,
so that long prompts do not slow down the requests that are already generating.

Please summarize the following article in three sentences. Keep the names of the people and the
places, and do not add anything that the article does not say.

Can you help me write an email to my team? I want to tell them that the release is delayed by one
week because we found a bug in the scheduler, and that we will meet on Monday morning to decide
what to do next. Keep it short and friendly.

Sure! Here is a draft:

Hi everyone,

We found a bug in the scheduler during testing, so the release will be one week late. Let's meet
on Monday at ten to go through the options. Thanks for your patience, and have a good weekend!

Best regards,
Alex

The history of computing is a history of abstraction. Early programmers wrote machine code by
hand; assemblers gave names to instructions, compilers translated languages that people could
read, and operating systems hid the details of the hardware behind files, processes and
sockets. Each layer made the next generation of programs possible, and each layer was at first
considered too slow to be useful.

The river flows from the mountains in the north through forests and farmland to the sea. In the
spring, when the snow melts, it floods the valley, and the farmers plant rice in the wet fields.
The old town on its bank has a stone bridge, a market square and a church with a tall tower that
you can climb for a view of the whole region.

To make a simple tomato soup, cook one chopped onion and two cloves of garlic in olive oil until
soft. Add a kilogram of ripe tomatoes, a pinch of salt and half a litre of water, and simmer for
twenty minutes. Blend until smooth, season with pepper and fresh basil, and serve with bread.

Photosynthesis is the process by which plants, algae and some bacteria convert light energy into
chemical energy. Using sunlight, water and carbon dioxide, they produce glucose and release oxygen.
Almost all life on Earth depends on it, directly or indirectly, for food and for the air we
breathe.

Question: What is the capital of France?
Answer: The capital of France is Paris.

Question: How many days are there in a leap year?
Answer: A leap year has 366 days; February has 29 days instead of 28.

Question: Why is the sky blue?
Answer: Sunlight is scattered by the molecules of the air, and shorter wavelengths, which we see
as blue, are scattered much more than longer ones.

She opened the door slowly. The room was dark, and the only sound was the ticking of a clock
somewhere behind the shelves. "Is anyone here?" she asked. Nobody answered. She found the light
switch, and when the lamp came on she saw that the desk was covered with maps, letters and old
photographs, all of the same house by the lake.

If a test fails only on the build machine, check the environment first: the versions of the
compiler and the libraries, the locale, the time zone, and whether the test depends on the order
in which files are listed. Then run it alone, with verbose output, and compare the logs with a
passing run.

The meeting is scheduled for Tuesday, March 14, at 3:30 PM in room 204. The agenda covers the
budget for the next quarter, the hiring plan, and the results of the customer survey. Please
read the attached report before the meeting and send your questions by Monday evening.

Explain the difference between a process and a thread. A process has its own address space,
file descriptors and resources; threads of the same process share memory and can communicate
cheaply, but a bug in one thread can corrupt the state of all of them. Processes are isolated
from each other, so a crash in one does not bring down the others.

Translate the following sentence into German: "The weather is nice today, so we will walk to the
park." Answer: "Das Wetter ist heute schön, also gehen wir zu Fuß in den Park."

Write a haiku about autumn.
Red leaves on the path,
the wind carries them away,
quiet evening light.

I'm not sure what you mean. Could you give me more details about what you're trying to do, what
you've already tried, and what happened? That'll help me find the right answer for you.
"""

WORDS = """\
the of and to a in is it you that he was for on are with as I his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most people my over
know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard start might story
saw far sea draw left late run while press close night real life few north open seem together
next white children begin got walk example ease paper group always music those both mark often
letter until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave
song measure door product black short numeral class wind question happen complete ship area half
rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest
correct able pound done beauty drive stood contain front teach week final gave green quick develop
ocean warm free minute strong special mind behind clear tail produce fact street inch multiply
nothing course stay wheel full force blue object decide surface deep moon island foot system busy
test record boat common gold possible plane instead dry wonder laugh thousand ago ran check game
shape equate miss brought heat snow tire bring yes distant fill east paint language among grand
ball yet wave drop heart present heavy dance engine position arm wide sail material size vary
settle speak weight general ice matter circle pair include divide syllable felt perhaps pick
sudden count square reason length represent art subject region energy hunt probable bed brother
egg ride cell believe fraction forest sit race window store summer train sleep prove lone exercise
wall catch mount wish sky board joy winter sat written wild instrument kept glass grass cow job
edge sign visit past soft fun bright gas weather month million bear finish happy hope flower
clothe strange gone jump baby eight village meet root buy raise solve metal whether push seven
paragraph third shall held hair describe cook floor either result burn hill safe cat century
consider type law bit coast copy phrase silent tall sand soil roll temperature finger industry
value fight lie beat excite natural view sense ear else quite broke case middle kill son lake
moment scale loud spring observe child straight consonant nation dictionary milk speed method
organ pay age section dress cloud surprise quiet stone tiny climb cool design poor lot experiment
bottom key iron single stick flat twenty skin smile crease hole trade melody trip office receive
row mouth exact symbol die least trouble shout except wrote seed tone join suggest clean break
lady yard rise bad blow oil blood touch grew cent mix team wire cost lost brown wear garden equal
sent choose fell fit flow fair bank collect save control decimal gentle woman captain practice
separate difficult doctor please protect noon whose locate ring character insect caught period
indicate radio spoke atom human history effect electric expect crop modern element hit student
corner party supply bone rail imagine provide agree thus capital chair danger fruit rich thick
soldier process operate guess necessary sharp wing create neighbor wash bat rather crowd corn
compare poem string bell depend meat rub tube famous dollar stream fear sight thin triangle planet
hurry chief colony clock mine tie enter major fresh search send yellow gun allow print dead spot
desert suit current lift rose continue block chart hat sell success company subtract event
particular deal swim term opposite wife shoe shoulder spread arrange camp invent cotton born
determine quart nine truck noise level chance gather shop stretch throw shine property column
molecule select wrong gray repeat require broad prepare salt nose plural anger claim continent
oxygen sugar death pretty skill women season solution magnet silver thank branch match suffix
especially fig afraid huge sister steel discuss forward similar guide experience score apple
bought led pitch coat mass card band rope slip win dream evening condition feed tool total basic
smell valley nor double seat arrive master track parent shore division sheet substance favor
connect post spend chord fat glad original share station dad bread charge proper bar offer
segment slave duck instant market degree populate chick dear enemy reply drink occur support
speech nature range steam motion path liquid log meant quotient teeth shell neck model request
server client token cache memory request response network latency throughput worker router queue
schedule deploy cluster node container service config error warning message function variable
return import class object string integer float boolean array list dictionary value default
option argument parameter file directory path command output input user system assistant prompt
context window batch stream event metric log version release update install build compile debug
"""

CODE = '''\
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Request:
    """One chat completion request."""

    model: str
    messages: list[dict[str, str]] = field(default_factory=list)
    max_tokens: int = 256
    temperature: float = 0.7

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "messages": self.messages})


def read_config(path: Path) -> dict[str, object]:
    if not path.exists():
        raise FileNotFoundError(f"no config at {path}")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


async def main() -> None:
    for i in range(10):
        if i % 2 == 0:
            print(i, "is even")
        else:
            print(i, "is odd")


class Node:
    def __init__(self, value, children=None):
        self.value = value
        self.children = children or []

    def __repr__(self):
        return f"Node({self.value!r}, {len(self.children)} children)"

{"model": "mock-llama", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
{"id": "chatcmpl-123", "object": "chat.completion.chunk", "choices": [{"index": 0,
 "delta": {"content": "Hi"}, "finish_reason": null}], "usage": {"prompt_tokens": 12}}

name: local
frontend:
  host: 127.0.0.1
  port: 8000
workers:
  agg:
    engine: mocker
    replicas: 2

$ curl -s localhost:8000/v1/models | jq .
$ git commit -m "Fix the scheduler" && git push origin main
$ pip install -e '.[test]' && pytest -x -q

SELECT name, COUNT(*) AS total FROM orders WHERE created_at > '2024-01-01' GROUP BY name;

<html><head><title>Example</title></head><body><p class="note">Hello, world!</p></body></html>

| model | tokens/s | latency (ms) |
|-------|---------:|-------------:|
| small |   1200.5 |         35.2 |

fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!("{:?}", v); }
int main(void) { printf("%d\\n", 42); return 0; }
const total = items.reduce((sum, x) => sum + x.price, 0);
'''

MULTILINGUAL = """\
大型语言模型在图形处理器上运行。
请用三句话总结这篇文章。
今天天气很好，我们去公园散步吧。
中华人民共和国的首都是北京。
人工智能正在改变我们的生活和工作方式。
東京は日本の首都です。
今日はいい天気ですね。散歩に行きましょう。
ありがとうございます。よろしくお願いします。
機械学習のモデルを訓練するには大量のデータが必要です。
서울은 대한민국의 수도입니다.
오늘 날씨가 정말 좋네요.
감사합니다. 좋은 하루 보내세요.
Москва — столица России. Сегодня хорошая погода.
Пожалуйста, кратко изложите эту статью.
Большие языковые модели работают на графических процессорах.
القاهرة هي عاصمة مصر. الطقس جميل اليوم.
شكرا جزيلا على مساعدتك.
दिल्ली भारत की राजधानी है। आज मौसम अच्छा है।
धन्यवाद, आपका दिन शुभ हो।
Η Αθήνα είναι η πρωτεύουσα της Ελλάδας. Καλημέρα σε όλους.
Hôm nay trời đẹp quá. Cảm ơn bạn rất nhiều.
Bugün hava çok güzel. Teşekkür ederim.
¿Dónde está la estación de tren? Mañana vamos a la playa con los niños.
El modelo de lenguaje responde en español cuando la pregunta está en español.
Où est la gare ? Nous allons à la plage demain avec les enfants, s'il fait beau.
Ça coûte combien ? C'était une très belle journée à la campagne.
Wo ist der Bahnhof? Morgen fahren wir mit den Kindern an den Strand.
Die Größe des Speichers hängt von der Länge der Eingabe ab.
Onde fica a estação? Amanhã vamos à praia com as crianças.
Dziękuję bardzo. Gdzie jest dworzec? Jutro jedziemy nad morze.
Tack så mycket. Var ligger stationen? Vi åker till stranden i morgon.
😀 😃 😄 😁 😆 😅 😂 🤣 😊 😇 🙂 🙃 😉 😍 🥰 😘 🤔 🤗 👍 👎 👏 🙏 💪 🎉 🎈 ❤️ 💯 🔥 ✨ ⭐ 🚀 🌍 🍕
👨‍👩‍👧‍👦 🏳️‍🌈 👋🏽 ✅ ❌ ⚠️ → ← ↑ ↓ • … — – “quoted” ‘single’ « guillemets »
© ® ™ € £ ¥ ° ± × ÷ ≤ ≥ ≠ ∞ π Σ √
"""


def _lcg(seed: int) -> Iterator[int]:
    """A fixed 64-bit linear congruential generator (Knuth's MMIX constants).

    Used instead of :mod:`random` so that the corpus cannot change with the Python version.
    """
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        yield state >> 33


_SUFFIXES = ("s", "ed", "ing", "er", "ly", "ness", "ment", "able", "tion", "al", "ful", "less")
_PREFIXES = ("un", "re", "pre", "dis", "over", "in")
_WRAPS = (("(", ")"), ('"', '"'), ("`", "`"), ("**", "**"), ("", ","), ("", ";"), ("", ":"))


def _variant(word: str, r: int) -> str:
    """Word ``word`` or a derived form (suffix, prefix, capital), chosen by ``r``.

    The forms need not be real words: they teach BPE the affixes, so words the corpus never
    saw still split into a few pieces rather than into letters.
    """
    kind = r % 16
    if kind < 10 or (kind < 15 and len(word) < 4):  # no affixes on "the", "of", "and"...
        return word
    if kind < 14:
        suffix = _SUFFIXES[(r >> 4) % len(_SUFFIXES)]
        stem = word[:-1] if word.endswith("e") and suffix[0] in "aei" else word
        return stem + suffix
    if kind == 14:
        return _PREFIXES[(r >> 4) % len(_PREFIXES)] + word
    return word.capitalize()


def pseudo_sentences(count: int, seed: int = 1) -> Iterator[str]:
    """``count`` sentences of words from :data:`WORDS`, drawn with Zipf-like weights.

    Word ``k`` (0-based rank) is drawn with probability proportional to ``1 / (k + 1)``, the
    shape of real word frequencies, so BPE merges the frequent words first. Some numbers are
    mixed in, so digit groups get merges too. Integer arithmetic only: float ``pow`` may round
    differently on another libm, and one different word would change the tokenizer.
    """
    words = list(dict.fromkeys(WORDS.split()))  # first occurrence fixes the rank
    cumulative = list(accumulate(1_000_000 // (k + 1) for k in range(len(words))))
    rng = _lcg(seed)
    for _ in range(count):
        length = 6 + next(rng) % 12
        out = []
        for _ in range(length):
            r = next(rng)
            if r % 17 == 0:
                out.append(str(r % 100000))
            else:
                word = _variant(words[bisect_right(cumulative, r % cumulative[-1])], next(rng))
                # Punctuation as in prose and Markdown, so " (", "`", ", " get merges too.
                left, right = _WRAPS[next(rng) % len(_WRAPS)] if r % 5 == 0 else ("", "")
                out.append(left + word + right)
        out[0] = out[0].capitalize()
        yield " ".join(out) + (".", "?", "!", ",")[next(rng) % 4]


def texts(pseudo_count: int = 20000) -> list[str]:
    """The whole training corpus, one string per paragraph or line, in a fixed order."""
    parts = [p for p in PROSE.split("\n\n") if p.strip()]
    parts += [CODE, *MULTILINGUAL.splitlines()]
    parts += pseudo_sentences(pseudo_count)
    return parts
