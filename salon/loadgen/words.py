"""Plausible chat text from a fixed word list and a seeded random generator (no external data).

The list mixes function words (frequent, as in real dialogue) with content words, so the
tokenizer sees ordinary English: roughly 1.2-1.4 tokens per word with the Gemma vocabulary.
"""

from __future__ import annotations

import random

FUNCTION_WORDS = (
    "the a an and but or so if then when because while as of to in on at by for with from about into over "
    "after before under again I you he she we they it me him her us them my your his our their this that "
    "these those is are was were be been being have has had do does did can could will would should may "
    "might must not no yes just very really also too only still even maybe perhaps here there now"
).split()

CONTENT_WORDS = (
    "time day night morning evening year week moment story idea plan dream question answer reason problem "
    "place house room door window garden street city village forest river sea mountain road bridge tower "
    "castle market library kitchen table chair book letter map key lamp candle fire rain snow wind sun moon "
    "star sky cloud storm light shadow voice song music word name friend family mother father sister brother "
    "child teacher student doctor captain king queen knight dragon wizard witch ghost stranger traveler "
    "merchant sailor soldier cat dog horse bird fish tea coffee bread soup apple cake dinner breakfast "
    "journey adventure secret treasure promise memory feeling heart mind hand eye face smile laugh tear "
    "know think feel want need like love hate hope wish remember forget believe understand wonder imagine "
    "see look watch hear listen say tell ask reply whisper shout call write read learn teach find lose keep "
    "give take bring carry hold open close begin start stop wait stay leave return arrive walk run climb "
    "swim fly sit stand sleep wake eat drink cook build break fix help try play work rest travel follow "
    "good bad new old young little big small long short high low quiet loud warm cold bright dark soft hard "
    "strange curious gentle brave clever kind happy sad tired hungry afraid calm busy careful honest quick "
    "slow early late ready sure certain different same whole strong weak beautiful simple quietly slowly "
    "suddenly carefully softly finally almost always never often sometimes together alone away back"
).split()

PUNCTUATION = (".", ".", ".", "!", "?", ",")


def sentence_words(rng: random.Random, num_words: int) -> list[str]:
    """`num_words` words drawn with a 40/60 mix of function and content words."""
    return [rng.choice(FUNCTION_WORDS) if rng.random() < 0.4 else rng.choice(CONTENT_WORDS) for _ in range(num_words)]


def make_text(rng: random.Random, num_words: int) -> str:
    """A run of sentences with exactly `num_words` words (at least one), capitalised and punctuated."""
    num_words = max(1, num_words)
    out: list[str] = []
    remaining = num_words
    while remaining > 0:
        length = min(remaining, rng.randint(4, 14))
        words = sentence_words(rng, length)
        words[0] = words[0].capitalize()
        end = rng.choice(PUNCTUATION)
        out.append(" ".join(words) + (end if end != "," else "."))
        remaining -= length
    return " ".join(out)


def make_name(rng: random.Random) -> str:
    syllables = ("ka", "ri", "lo", "mi", "sa", "to", "ne", "va", "el", "an", "ru", "is", "or", "de", "li")
    return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))).capitalize()
