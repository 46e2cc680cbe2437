"""A reward function of your own (docs/byot.md): 1 for the right number, a bonus for GSM8K's '#### n' form."""
import re


def gsm8k(prompt: str, completion: str, item: dict) -> dict:
    stated = re.search(r"####\s*(-?[\d,.]+)\s*$", completion.strip())
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", completion)
    answer = stated.group(1) if stated else (numbers[-1] if numbers else "")
    gold = item["answer"].split("####")[-1].strip()
    return {"correct": float(answer.replace(",", "") == gold.replace(",", "")), "format": float(stated is not None)}
