"""The prompts of `benchmarks/speculative.py`: input-grounded requests (rewrite a given Python function, so most of
the answer is copied from the prompt) and open-ended ones (a short story, nothing to copy).

The four functions are realistic, untyped helper code of about 40 lines each; the instructions ask for answers that
repeat the function with small changes (type hints, a docstring, comments, clearer names), the case prompt lookup is
made for (HF's "prompt lookup decoding": summaries, code edits, question answering over a document).
"""

from __future__ import annotations

FUNCTIONS = [
    '''def load_user_records(path, required_fields, default_country="US", skip_invalid=True):
    records = []
    errors = []
    seen_ids = set()
    with open(path, "r", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        for line_number, row in enumerate(reader, start=2):
            missing = [field for field in required_fields if not row.get(field)]
            if missing:
                message = f"line {line_number}: missing {', '.join(missing)}"
                if skip_invalid:
                    errors.append(message)
                    continue
                raise ValueError(message)
            user_id = int(row["id"])
            if user_id in seen_ids:
                errors.append(f"line {line_number}: duplicate id {user_id}")
                continue
            seen_ids.add(user_id)
            email = row["email"].strip().lower()
            if "@" not in email:
                errors.append(f"line {line_number}: invalid email {email!r}")
                if not skip_invalid:
                    raise ValueError(errors[-1])
                continue
            country = row.get("country") or default_country
            age = row.get("age")
            record = {
                "id": user_id,
                "name": row["name"].strip(),
                "email": email,
                "country": country.upper(),
                "age": int(age) if age else None,
                "tags": [tag.strip() for tag in row.get("tags", "").split(";") if tag.strip()],
            }
            records.append(record)
    records.sort(key=lambda record: record["id"])
    return records, errors
''',
    '''def summarize_orders(orders, tax_rate, discounts=None, currency="EUR"):
    discounts = discounts or {}
    totals_by_customer = {}
    items_by_category = {}
    largest_order = None
    refunded = 0
    for order in orders:
        if order["status"] == "refunded":
            refunded += 1
            continue
        subtotal = 0.0
        for item in order["items"]:
            price = item["unit_price"] * item["quantity"]
            category = item.get("category", "other")
            items_by_category[category] = items_by_category.get(category, 0) + item["quantity"]
            subtotal += price
        code = order.get("discount_code")
        if code in discounts:
            subtotal = subtotal * (1 - discounts[code])
        total = round(subtotal * (1 + tax_rate), 2)
        customer = order["customer_id"]
        totals_by_customer[customer] = totals_by_customer.get(customer, 0.0) + total
        if largest_order is None or total > largest_order["total"]:
            largest_order = {"id": order["id"], "customer": customer, "total": total}
    ranked = sorted(totals_by_customer.items(), key=lambda pair: pair[1], reverse=True)
    top_customers = [customer for customer, _ in ranked[:5]]
    average = sum(totals_by_customer.values()) / len(totals_by_customer) if totals_by_customer else 0.0
    report = {
        "currency": currency,
        "customers": len(totals_by_customer),
        "revenue": round(sum(totals_by_customer.values()), 2),
        "average_per_customer": round(average, 2),
        "top_customers": top_customers,
        "largest_order": largest_order,
        "items_by_category": dict(sorted(items_by_category.items())),
        "refunded_orders": refunded,
    }
    return report
''',
    '''def retry_request(session, url, method="GET", payload=None, max_attempts=5, backoff=0.5, timeout=10):
    attempt = 0
    last_error = None
    delays = []
    while attempt < max_attempts:
        attempt += 1
        try:
            if method == "GET":
                response = session.get(url, params=payload, timeout=timeout)
            elif method == "POST":
                response = session.post(url, json=payload, timeout=timeout)
            else:
                raise ValueError(f"unsupported method {method}")
            if response.status_code == 429:
                retry_after = response.headers.get("Retry-After")
                delay = float(retry_after) if retry_after else backoff * 2 ** attempt
                delays.append(delay)
                time.sleep(delay)
                continue
            if 500 <= response.status_code < 600:
                last_error = RuntimeError(f"server error {response.status_code} from {url}")
                delay = backoff * 2 ** attempt
                delays.append(delay)
                time.sleep(delay)
                continue
            response.raise_for_status()
            return {
                "status": response.status_code,
                "body": response.json(),
                "attempts": attempt,
                "delays": delays,
            }
        except (ConnectionError, TimeoutError) as error:
            last_error = error
            delay = backoff * 2 ** attempt
            delays.append(delay)
            time.sleep(delay)
    raise RuntimeError(f"giving up on {url} after {attempt} attempts") from last_error
''',
    '''def build_inverted_index(documents, stop_words, min_length=3, lowercase=True):
    index = {}
    document_lengths = {}
    vocabulary = set()
    for doc_id, text in documents.items():
        if lowercase:
            text = text.lower()
        tokens = []
        word = ""
        for character in text:
            if character.isalnum():
                word += character
            else:
                if word:
                    tokens.append(word)
                word = ""
        if word:
            tokens.append(word)
        kept = [token for token in tokens if len(token) >= min_length and token not in stop_words]
        document_lengths[doc_id] = len(kept)
        for position, token in enumerate(kept):
            vocabulary.add(token)
            postings = index.setdefault(token, {})
            postings.setdefault(doc_id, []).append(position)
    total_documents = len(documents)
    idf = {}
    for token, postings in index.items():
        idf[token] = math.log((1 + total_documents) / (1 + len(postings))) + 1
    average_length = sum(document_lengths.values()) / total_documents if total_documents else 0.0
    statistics = {
        "documents": total_documents,
        "vocabulary_size": len(vocabulary),
        "average_length": average_length,
        "longest_document": max(document_lengths, key=document_lengths.get) if document_lengths else None,
    }
    return {
        "index": index,
        "idf": idf,
        "lengths": document_lengths,
        "statistics": statistics,
    }
''',
]

# The batch-1 request is the first; larger batches cycle through the instructions, then the functions.
INSTRUCTIONS = [
    "Rewrite this function with type hints:",
    "Add a docstring to this function and show the whole function:",
    "Rewrite this function with a comment above each block:",
    "Rewrite this function with clearer variable names:",
]

STORIES = [
    "Write a short story about a robot.",
    "Write a short story about a dragon who is afraid of the dark.",
    "Write a short story about a lighthouse keeper.",
    "Write a short story about a cat who solves mysteries.",
]


def code_messages(batch: int) -> list[list[dict]]:
    """`batch` conversations, each one user message asking to rewrite one of `FUNCTIONS`: row i uses function
    i % 4 and instruction (i // 4) % 4, so rows 0-3 are the four functions under the type-hint instruction."""
    return [
        [{"role": "user", "content": f"{INSTRUCTIONS[(row // 4) % 4]}\n\n```python\n{FUNCTIONS[row % 4]}```"}]
        for row in range(batch)
    ]


def story_messages(batch: int) -> list[list[dict]]:
    """`batch` conversations asking for a short story (nothing in the prompt to copy)."""
    return [[{"role": "user", "content": STORIES[row % len(STORIES)]}] for row in range(batch)]


def copy_messages(batch: int) -> list[list[dict]]:
    """`batch` conversations asking to repeat one of `FUNCTIONS` unchanged: the best case of prompt lookup (the answer
    is the prompt), to show the ceiling of its speedup under the same costs."""
    return [[{"role": "user", "content": f"Repeat this function exactly, without any change:\n\n```python\n"
                                          f"{FUNCTIONS[row % 4]}```"}] for row in range(batch)]


PROMPT_SETS = {"code": code_messages, "story": story_messages, "copy": copy_messages}
