"""Calibration text for activation smoothing: varied registers (prose, dialogue, code, lists, numbers).

Written for this project; deliberately unrelated to any evaluation text.
"""

CALIBRATION_TEXT = """\
The harbour town wakes before the sun. Fishing boats slip their moorings one by one, their engines
coughing in the cold, and the gulls follow them out past the breakwater where the water turns from
green to slate. By seven the bakery on Quay Street has sold its first tray of rolls, and the owner,
a tall woman named Marguerite who has run the place for thirty-one years, is already arguing with
the flour supplier on the telephone about a delivery that arrived two sacks short.

User: Can you help me plan a three-day trip to the mountains in October?
Character: Of course! October is a lovely time to go. Will you be hiking, or would you rather take
scenic drives and stay somewhere cosy? Tell me a little about what you enjoy and your budget.
User: Mostly hiking, nothing too extreme. Maybe 10 to 15 kilometres a day. Budget is moderate.
Character: Perfect. Day one: arrive by noon, check in, and do the lake loop (about 9 km, mostly
flat) to get your legs going. Day two: the ridge trail, roughly 14 km with 600 m of climbing; start
early, pack layers, and bring at least two litres of water. Day three: a gentle forest walk before
driving home. Shall I suggest a few places to stay?

def merge_intervals(intervals):
    \"\"\"Merge overlapping [start, end] pairs and return them sorted.\"\"\"
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged

print(merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]))  # [[1, 6], [8, 10], [15, 18]]

Quarterly results: revenue rose 12.4% to $48.7 million, while operating costs grew only 3.1%.
The board approved a dividend of $0.42 per share, payable on 15 March 2024 to shareholders of
record on 1 March. Net margin improved from 8.9% to 11.2%; cash on hand stood at $19.3 million.

Photosynthesis converts light energy into chemical energy. In the light-dependent reactions, water
is split, oxygen is released, and ATP and NADPH are produced. The Calvin cycle then uses that ATP and
NADPH to fix carbon dioxide into three-carbon sugars, which the plant assembles into glucose,
starch and cellulose. Without this process, almost no food chain on Earth could exist.

"I don't think we should open it," said Tomas, stepping back from the crate.
"We came all this way," Lena replied. "Whatever is inside, we deserve to know."
The lid gave way with a groan. Inside, wrapped in oilcloth, lay a brass instrument covered in dials,
none of which either of them had ever seen before. A small card was tied to the handle: FOR WHOEVER
FINDS THIS - WIND IT TWICE, THEN WAIT.

Shopping list:
- 2 kg potatoes
- 1 dozen eggs
- olive oil (extra virgin)
- 500 g spaghetti
- fresh basil, garlic, lemons
- coffee beans (dark roast)

SELECT customer_id, COUNT(*) AS orders, SUM(total) AS spent
FROM orders
WHERE created_at >= '2023-01-01'
GROUP BY customer_id
HAVING SUM(total) > 1000
ORDER BY spent DESC;

Les enfants jouaient dans le parc pendant que leurs parents discutaient sur un banc. Es war ein
warmer Nachmittag, und niemand hatte es eilig. El sol se ponía lentamente detrás de las colinas.

To reset the device, hold the power button for ten seconds until the light blinks amber, then
release it and press it once more. If the light stays red, unplug the unit for at least one minute.
Warranty claims must include the serial number (printed under the base, format AB-1234-5678).

The old professor leaned back in his chair. "Mathematics," he said, "is not about numbers. It is
about patterns, and about the stubborn refusal to accept that something is true merely because it
looks true. Prove it, and then you may believe it." He wrote on the board: for every integer n > 1,
the sum 1 + 2 + ... + n equals n(n + 1)/2, and asked who could show why.
"""
