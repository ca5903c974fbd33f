"""Short stories about one small seaside town, for the demo model to learn plain English from.

A tiny model learns fluent sentences from simple, regular text far better than from a few
pages of technical prose, so most of the demo corpus is written here as a seeded story grammar:
the same few characters, places and things in many combinations, always in whole, well-formed
sentences, one short story per paragraph. Everything is written for hfbridge (no outside text),
and :func:`stories` returns the same list for the same seed on every Python version.

>>> tales = stories(3)
>>> len(tales), tales == stories(3)
(3, True)
>>> all(tale.rstrip().endswith((".", "!", '."', '!"', '?"')) for tale in stories(50))
True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["stories"]


@dataclass(frozen=True)
class _Being:
    """Someone in the town: how to name them and what they usually do (past tense phrases)."""

    name: str
    he: str  # subject pronoun: "she", "he" or "it"
    home: str
    habits: tuple[str, ...]

    @property
    def him(self) -> str:
        return {"she": "her", "he": "him", "it": "it"}[self.he]

    @property
    def his(self) -> str:
        return {"she": "her", "he": "his", "it": "its"}[self.he]


_TOWN = "Wren Harbour"
_BEINGS = (
    _Being("the lighthouse keeper", "she", "the lighthouse", (
        "climbed the long stairs of the tower every evening and lit the great lamp",
        "watched the ships come home through the fog",
        "wrote the weather in a big blue book every morning",
        "polished the glass of the lamp until it shone like the sun",
        "counted the ships that passed the rocks at night",
        "kept a pot of tea warm on the stove for anyone who came to visit",
    )),
    _Being("the baker", "she", "the bakery", (
        "got up before the sun to bake bread for the whole town",
        "made round loaves, sweet buns and apple pies",
        "gave the old crusts to the birds in the square",
        "sang while the bread was in the oven",
        "sold warm rolls to the fishermen at the harbour",
    )),
    _Being("the little robot", "it", "the workshop", (
        "liked to count the stones on the path and the boats in the harbour",
        "hummed a quiet song when it was happy",
        "had a small green light on its head that blinked when it was thinking",
        "carried letters and parcels for anyone who asked",
        "wanted to learn the name of every bird in the town",
    )),
    _Being("the cat", "it", "the bakery", (
        "slept on the warm windowsill of the bakery",
        "chased the leaves across the square",
        "watched the fish in the harbour with great interest",
        "walked along the top of the garden wall every afternoon",
    )),
    _Being("the train driver", "he", "the station", (
        "drove the blue train from the station to the hills and back",
        "blew the whistle three times before every journey",
        "checked the wheels of the train every morning",
        "knew the name of every station on the line",
    )),
    _Being("the fisherman", "he", "the harbour", (
        "sailed out in his small red boat before dawn",
        "mended his nets on the harbour wall",
        "told long stories about the sea",
        "brought fresh fish to the market every morning",
    )),
    _Being("the teacher", "she", "the school", (
        "read a story to the children at the end of every day",
        "taught the children how to read the stars",
        "kept a box of shells and stones from the beach on her desk",
    )),
    _Being("the old dog", "it", "the farm", (
        "slept in the sun by the farm gate",
        "walked slowly to the village every morning",
        "barked once at every stranger and then wagged its tail",
    )),
    _Being("Lily", "she", "the blue house by the school", (
        "liked to draw maps of the town",
        "collected shells on the beach",
        "asked many questions about the stars",
        "flew her red kite on the hill",
    )),
    _Being("Sam", "he", "the yellow house by the river", (
        "liked to build boats out of wood",
        "fed the ducks on the river every afternoon",
        "wanted to drive the train one day",
        "read books about the sea",
    )),
)
_PLACES = (
    "the harbour", "the market", "the station", "the bakery", "the lighthouse", "the beach",
    "the hill", "the park", "the library", "the river", "the old bridge", "the square", "the forest",
)
_THINGS = (  # (with "a", with "the")
    ("a red kite", "the red kite"), ("a small bell", "the small bell"), ("an old map", "the old map"),
    ("a blue scarf", "the blue scarf"), ("a wooden box", "the wooden box"), ("a letter", "the letter"),
    ("a lantern", "the lantern"), ("a basket of apples", "the basket of apples"),
    ("a book about the stars", "the book about the stars"), ("a green umbrella", "the green umbrella"),
    ("a silver key", "the silver key"), ("a jar of honey", "the jar of honey"),
)
_HIDING = (
    "under a bench in the park", "behind the door of the bakery", "in the tall grass on the hill",
    "next to the old bridge", "on a shelf in the library", "by the steps of the station",
    "in the sand on the beach", "under a pile of nets at the harbour",
)
_TIMES = (
    "Once upon a time", "One morning", "One sunny morning", "Early one morning", "One afternoon", "One evening",
    "On Monday", "On a cold winter day", "One day in spring", "On a warm summer evening",
)
_WEATHER = (
    "The sun was warm and the sky was clear.", "A soft rain was falling on the roofs.",
    "A thick fog rolled in from the sea.", "The wind was strong and cold.",
    "Snow lay on the roofs and the streets were quiet.", "The sea was calm and bright.",
    "Dark clouds were coming over the hills.",
)
_ENDINGS = (
    "It was a good day.", "That night, everyone in {town} slept well.",
    "Then they walked home together.", "And the lamp in the lighthouse shone all night.",
    "They both agreed that it had been a very good day.", "After that, they were good friends.",
)


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _a(the_place: str) -> str:
    """``"the old bridge"`` -> ``"an old bridge"``."""
    noun = the_place.removeprefix("the ")
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _pair(rng: random.Random) -> tuple[_Being, _Being]:
    a, b = rng.sample(_BEINGS, 2)
    return a, b


def _lost_thing(rng: random.Random) -> list[str]:
    a, b = _pair(rng)
    thing, the_thing = rng.choice(_THINGS)
    first, second = rng.sample(_PLACES, 2)
    found = rng.choice(_HIDING)
    said = rng.choice(("said", "cried", "laughed"))
    return [
        f"{rng.choice(_TIMES)}, {a.name} went to {first}.",
        rng.choice(_WEATHER),
        rng.choice((f"There {a.he} met {b.name}, who looked very sad.", f"There {a.he} saw {b.name}, who was crying.",
                    f"On the way {a.he} met {b.name}, who looked worried.")),
        f"\"I have lost {thing},\" said {b.name}. \"Can you help me find it?\"",
        rng.choice((f"{_cap(a.name)} and {b.name} looked everywhere, from {first} to {second}.",
                    f"They looked at {first}, then at {second}, but it was not there.",
                    "So they searched together all morning.")),
        f"At last {a.he} found {the_thing} {found}.",
        f"\"Thank you!\" {said} {b.name}.",
        rng.choice(_ENDINGS).format(town=_TOWN),
    ]


def _day(rng: random.Random) -> list[str]:
    a = rng.choice(_BEINGS)
    habits = rng.sample(a.habits, min(3, len(a.habits)))
    lines = [f"{_cap(a.name)} lived in {_TOWN}, near {a.home}."]
    lines.append(f"Every day, {a.he} {habits[0]}.")
    if len(habits) > 1:
        lines.append(f"{_cap(a.he)} also {habits[1]}.")
    if len(habits) > 2:
        lines.append(f"And when there was time, {a.he} {habits[2]}.")
    lines.append(f"{_cap(a.he)} loved {_TOWN}, and {_TOWN} loved {a.him} too.")
    return lines


def _storm(rng: random.Random) -> list[str]:
    sailor = _BEINGS[5]  # the fisherman
    helper = rng.choice((_BEINGS[2], _BEINGS[8], _BEINGS[9], _BEINGS[4]))
    when = rng.choice(("One evening", "One autumn night", "Late one afternoon"))
    return [
        f"{when}, a storm came in from the sea.",
        "The waves were high and the rain was heavy.",
        "The fisherman was still out in his small red boat, and he could not see the harbour.",
        "The lighthouse keeper climbed the stairs of the tower and lit the great lamp.",
        f"{_cap(helper.name)} ran to the harbour with a lantern to help.",
        "The light shone over the dark water, and the fisherman saw it.",
        "He sailed home safely, and everyone on the harbour wall cheered.",
        f"The next morning, {sailor.name} brought a basket of fish to the lighthouse to say thank you.",
    ]


def _journey(rng: random.Random) -> list[str]:
    a = rng.choice(tuple(being for being in _BEINGS if being.name != "the train driver"))
    town = rng.choice(("Stonebridge", "Millford", "Greenhill", "Ashby"))
    sights = rng.sample((
        "green fields", "a herd of brown cows", "a wide river", "an old mill",
        "a forest of tall pines", "a castle on a hill", "a lake full of swans",
    ), 2)
    reason = rng.choice((
        f"to visit {a.his} aunt", "to buy a new hat", "to see the big market", "to watch the boats on the lake",
    ))
    return [
        f"{rng.choice(_TIMES)}, {a.name} took the train to {town} {reason}.",
        "The train driver blew the whistle three times, and the blue train left the station.",
        f"From the window, {a.he} saw {sights[0]} and {sights[1]}.",
        f"The train went over the old bridge and through the hills, and at noon it reached {town}.",
        f"In {town}, {a.name} had a lovely time.",
        f"In the evening, {a.he} took the train back home to {_TOWN}.",
    ]


def _gift(rng: random.Random) -> list[str]:
    a, b = _pair(rng)
    made, the_made = rng.choice((
        ("a cake with seven candles", "the cake"), ("a kite with a long tail", "the kite"),
        ("a small wooden boat", "the boat"), ("a map of the whole town", "the map"),
        ("a warm blue scarf", "the scarf"), ("a song about the sea", "the song"),
    ))
    when = rng.choice(("the next day", "on Saturday", "that evening"))
    return [
        f"{_cap(a.name)} wanted to give {b.name} a present.",
        f"{_cap(a.he)} thought for a long time, and then {a.he} made {made}.",
        f"The work took {rng.choice(('three days', 'a whole week', 'all afternoon'))}.",
        f"{_cap(a.he)} gave {b.name} {the_made} {when}.",
        f"{_cap(b.name)} was so happy that {b.he} could not stop smiling.",
        rng.choice(_ENDINGS).format(town=_TOWN),
    ]


def _question(rng: random.Random) -> list[str]:
    a, b = _pair(rng)
    question, answer = rng.choice((
        ("Why is the sea salty?", "The rivers bring salt from the rocks, and the sea keeps it."),
        ("Where do the ships go at night?", "They sail to other towns, and the lighthouse shows them the way."),
        ("Why do the stars shine?", "They are suns, very far away."),
        ("How is bread made?", "You mix flour, water, salt and yeast, and then you bake it in a hot oven."),
        ("Why does the train blow its whistle?", "It tells everyone that the train is about to leave."),
        ("What makes the wind?", "Warm air rises, and cool air moves in to take its place."),
    ))
    place = rng.choice(_PLACES)
    return [
        f"{rng.choice(_TIMES)}, {a.name} and {b.name} sat together at {place}.",
        f"\"{question}\" asked {a.name}.",
        f"{_cap(b.name)} thought for a moment.",
        f"Then {b.he} said, \"{answer}\"",
        f"{_cap(a.name)} liked that answer very much.",
    ]


def _town(rng: random.Random) -> list[str]:
    places = rng.sample(_PLACES, 4)
    a, b = _pair(rng)
    return [
        f"{_TOWN} was a small town by the sea.",
        f"It had {_a(places[0])}, {_a(places[1])} and {_a(places[2])}.",
        "Everyone knew everyone, and nobody locked the door.",
        f"{_cap(a.name)} {rng.choice(a.habits)}, and {b.name} {rng.choice(b.habits)}.",
        f"Life in {_TOWN} was slow and kind.",
    ]


def _night_sky(rng: random.Random) -> list[str]:
    child = rng.choice((_BEINGS[8], _BEINGS[9], _BEINGS[2]))
    star, use = rng.choice((
        ("the North Star", "Sailors use it to find their way home."),
        ("the evening star", "It is the first light to shine after sunset."),
        ("the Great Bear", "Its seven stars look like a big spoon."),
    ))
    return [
        (f"{rng.choice(('One clear night', 'On a cold clear night', 'One summer night'))}, the teacher took "
        "the children up the hill to look at the stars."),
        rng.choice(("The moon rose slowly over the sea.", "The sky was dark and full of stars.")),
        f"\"That bright one is {star},\" said the teacher. \"{use}\"",
        f"{_cap(child.name)} counted {rng.choice(('three', 'five', 'seven'))} shooting stars "
        "and made a wish for each one.",
        f"Then they walked back down the hill with a lantern, and {child.he} dreamed of stars all night.",
    ]


def _market(rng: random.Random) -> list[str]:
    buyer = rng.choice(tuple(being for being in _BEINGS if being.name not in ("the baker", "the fisherman")))
    goods = ("a loaf of bread", "a jar of honey", "a bag of apples", "a warm scarf", "a piece of cheese")
    things = rng.sample(goods, 2)
    return [
        f"Every Saturday there was a market in the square of {_TOWN}.",
        "The baker sold bread and buns, and the fisherman sold fresh fish.",
        f"{_cap(buyer.name)} bought {things[0]} and {things[1]}.",
        rng.choice((
            "The cat waited by the fish stall and hoped for a treat.",
            "The little robot helped the old farmer carry his boxes.",
            "The children ran between the stalls and laughed.",
        )),
        rng.choice((
            "At noon the bell of the town hall rang twelve times.", "At noon the sun came out over the square.",
        )),
        "By the evening the market was empty, and the square was quiet again.",
    ]


def _snow(rng: random.Random) -> list[str]:
    cook, other = _pair(rng)
    chores = ("cleared the snow from the steps of the station", "pulled a sled up the hill",
              "brought warm bread to the old farmer")
    return [
        f"One winter morning, {_TOWN} woke up under a thick blanket of snow.",
        "The children built a snowman in the square and gave it the teacher's old hat.",
        f"{_cap(cook.name)} made hot soup for everyone who was cold.",
        f"{_cap(other.name)} {rng.choice(chores)}.",
        rng.choice((
            "The little robot had never seen snow before, and its green light blinked all day.",
            "The old dog rolled in the snow and barked with joy.",
            "The cat did not like the snow at all and stayed by the stove.",
        )),
        "That night the stars were very bright over the white roofs.",
    ]


def _lesson(rng: random.Random) -> list[str]:
    skill, teacher_name, steps = rng.choice((
        ("bake bread", "the baker", "mix the flour, knead the dough and wait for it to rise"),
        ("sail a boat", "the fisherman", "hold the rope, watch the wind and turn the sail"),
        ("read a map", "Lily", "find the north and follow the roads with a finger"),
        ("light the great lamp", "the lighthouse keeper", "trim the wick and clean the glass"),
        ("drive the train", "the train driver", "watch the signals and pull the brake slowly"),
    ))
    teacher = next(being for being in _BEINGS if being.name == teacher_name)
    learner = rng.choice(tuple(being for being in (_BEINGS[2], _BEINGS[8], _BEINGS[9]) if being is not teacher))
    return [
        f"{_cap(learner.name)} wanted to learn how to {skill}.",
        f"So {learner.he} asked {teacher.name} for help.",
        f"{_cap(teacher.name)} showed {learner.him} how to {steps}.",
        f"At first {learner.he} made many mistakes, but {learner.he} did not give up.",
        f"By the end of the week, {learner.he} could {skill} very well.",
        f"{_cap(teacher.name)} was proud of {learner.him}.",
    ]


def _picnic(rng: random.Random) -> list[str]:
    a, b, c = rng.sample(_BEINGS, 3)
    baskets = ("bread from the bakery", "a bag of apples", "a jar of honey", "a big cheese", "a bottle of lemonade")
    food = rng.sample(baskets, 3)
    return [
        f"On a warm summer day, {a.name}, {b.name} and {c.name} had a picnic on the hill.",
        f"{_cap(a.name)} brought {food[0]}, {b.name} brought {food[1]}, and {c.name} brought {food[2]}.",
        "They ate under the old tree and watched the boats in the harbour.",
        rng.choice((
            "A little bird came and ate the crumbs.",
            "The wind took a napkin and carried it over the hill.",
            "Far away, the blue train went over the old bridge.",
        )),
        "When the sun went down, they packed the basket and went home.",
    ]


_KINDS = (
    _lost_thing, _day, _storm, _journey, _gift, _question, _town, _night_sky, _market, _snow, _lesson, _picnic,
)


def stories(count: int, seed: int = 0) -> list[str]:
    """``count`` short stories, one paragraph each, the same for the same ``seed``.

    Args:
        count: Number of stories.
        seed: Seed of the ``random.Random`` that picks characters, places and sentences.
            Default: ``0``.

    >>> stories(1)[0].split(".")[0]
    'Wren Harbour was a small town by the sea'
    """
    rng = random.Random(seed)
    return [" ".join(rng.choice(_KINDS)(rng)) + "\n" for _ in range(count)]
