//! The seed lists of `bastion self-instruct`, written for this project: per
//! domain, the topics and the kinds of request (opening words) the target
//! is asked to continue, and the worked function headers shown before a
//! code `signature` request.

/// Seed topics of the chat domain, broad on purpose: the requests should
/// cover what users ask chat assistants about.
pub const TOPICS: &[&str] = &[
    "cooking and recipes",
    "personal finance and budgeting",
    "travel planning",
    "physics",
    "chemistry",
    "biology",
    "world history",
    "geography",
    "astronomy",
    "Python programming",
    "JavaScript and web development",
    "databases and SQL",
    "writing a professional email",
    "job interviews and careers",
    "fitness and exercise",
    "nutrition and healthy eating",
    "sleep and daily routines",
    "learning a foreign language",
    "music and musical instruments",
    "movies and television",
    "books and literature",
    "poetry",
    "philosophy",
    "economics",
    "starting a small business",
    "marketing and social media",
    "gardening",
    "pets and animal care",
    "home repair and DIY projects",
    "parenting",
    "friendship and relationships",
    "studying and exam preparation",
    "climate and the environment",
    "renewable energy",
    "computers and hardware",
    "smartphones and apps",
    "machine learning",
    "statistics and probability",
    "geometry",
    "algebra",
    "board games and puzzles",
    "sports",
    "art and drawing",
    "photography",
    "public speaking",
    "time management and productivity",
    "ethics and everyday dilemmas",
    "law and everyday legal questions",
    "mental well-being and stress",
    "cars and transportation",
];

/// Kinds of chat request, as `(label, opening words)`: the target
/// continues the opening words, so each kind starts the way such requests
/// do.
pub const KINDS: &[(&str, &str)] = &[
    ("explain", "Can you explain"),
    ("how-to", "How do I"),
    ("compare", "What is the difference between"),
    ("advice", "I need some advice."),
    ("brainstorm", "Give me a list of"),
    ("write", "Write a short"),
    ("rewrite", "Rewrite this sentence"),
    ("fact", "What is"),
    ("plan", "Can you make a plan"),
    ("opinion", "What are the pros and cons of"),
    ("summarize", "Summarize"),
    ("problem", "If I"),
    ("why", "Why does"),
    ("recommend", "Can you recommend"),
];

/// Seed topics of the competition-math domain: the seven subjects of the
/// MATH dataset (Hendrycks et al., 2021) and the topics inside them.
pub const MATH_TOPICS: &[&str] = &[
    "algebra",
    "linear equations",
    "quadratic equations",
    "systems of equations",
    "inequalities",
    "absolute value",
    "exponents and radicals",
    "functions and their inverses",
    "polynomials and their roots",
    "rational functions",
    "logarithms",
    "arithmetic and geometric sequences",
    "series and sums",
    "number theory",
    "prime numbers and factorization",
    "divisibility and remainders",
    "modular arithmetic",
    "greatest common divisors and least common multiples",
    "digits and number bases",
    "counting and combinations",
    "permutations and arrangements",
    "probability",
    "expected value",
    "geometry",
    "triangles and the Pythagorean theorem",
    "circles, chords and arcs",
    "areas and perimeters",
    "volumes of solids",
    "coordinate geometry",
    "similar triangles",
    "precalculus",
    "trigonometry",
    "complex numbers",
    "vectors",
    "matrices and determinants",
    "prealgebra",
    "fractions and decimals",
    "percentages and ratios",
    "rates, work and distance",
    "averages",
];

/// Kinds of competition-math problem, as `(label, opening words)`.
pub const MATH_KINDS: &[(&str, &str)] = &[
    ("find", "Find the"),
    ("compute", "Compute"),
    ("how-many", "How many"),
    ("what", "What is the"),
    ("if", "If"),
    ("let", "Let"),
    ("solve", "Solve for"),
    ("simplify", "Simplify"),
    ("evaluate", "Evaluate"),
    ("determine", "Determine"),
    ("suppose", "Suppose that"),
    ("largest", "What is the largest"),
];

/// Seed topics of the code domain: what short function-writing exercises
/// (HumanEval, MBPP) are about.
pub const CODE_TOPICS: &[&str] = &[
    "lists",
    "strings",
    "dictionaries",
    "sets",
    "tuples",
    "sorting",
    "searching",
    "prime numbers",
    "digits of integers",
    "matrices",
    "binary numbers and bits",
    "dates and times",
    "text parsing",
    "palindromes",
    "anagrams",
    "vowels and characters",
    "geometry formulas",
    "sequences such as Fibonacci",
    "recursion",
    "counting elements",
    "maximum and minimum values",
    "sums and products",
    "regular expressions",
    "list comprehensions",
    "nested lists",
    "intervals and ranges",
    "stacks and queues",
    "brackets and parentheses",
    "words in a sentence",
    "unit conversion",
    "averages and statistics",
    "duplicates",
];

/// Kinds of code task, as `(label, opening words)`. The `signature` kind
/// writes a Python function header with its docstring (the HumanEval
/// layout, [`Domain::Code`] templates it as HumanEval is); the others write
/// one-line tasks (the MBPP layout).
pub const CODE_KINDS: &[(&str, &str)] = &[
    ("function-to", "Write a function to"),
    ("python-function-to", "Write a python function to"),
    ("function-that", "Write a function that"),
    ("signature", "def "),
    ("function-which", "Write a function which"),
    ("check", "Write a function to check whether"),
    ("signature", "def "),
    ("count", "Write a python function to count"),
    ("find", "Write a function to find the"),
    ("signature", "def "),
];

/// Function headers shown before a code `signature` request, one per
/// instruction (chosen by topic), so the target writes the HumanEval layout.
pub(crate) const SIGNATURE_EXAMPLES: [&str; 4] = [
    "def count_words(text: str) -> int:\n    \"\"\"Return the number of words in the string text.\"\"\"",
    "def second_largest(numbers: list) -> int:\n    \"\"\"Return the second largest value in a list of at least two numbers.\"\"\"",
    "def is_leap_year(year: int) -> bool:\n    \"\"\"Return True if year is a leap year in the Gregorian calendar.\"\"\"",
    "def merge_counts(a: dict, b: dict) -> dict:\n    \"\"\"Return a dictionary with the keys of a and b and the sum of their values.\"\"\"",
];
