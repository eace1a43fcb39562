"""The weather tool the tool-calling tests ask the real Qwen2.5-Coder model about."""

WEATHER = {"type": "object", "properties": {"location": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["location"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}}]
QUESTION = [{"role": "user", "content": "What's the weather in Paris?"}]
