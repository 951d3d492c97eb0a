"""The words of the function-calling world: word lists and the table of API families.

Both are text, read by `world.py`; a table reads better so than as a few thousand lines
of formatted Python. This file is data, past the ~450 lines a code file keeps to.

`WORDS` holds the word lists, one per line: `name: word, word, ...` (a line that
starts with spaces continues the list above it). Strings drawn from them appear
in queries literally, so a model can copy them.

`API_TABLE` holds the API families. A `[family]` line opens one; each of its
functions is a line `name: description`, then one line per parameter, then its
query templates:

    name: TYPE | description                                    a required parameter
    name: TYPE = default "mention" | description                an optional one
    > template | template                                       query templates

A template names each required parameter as a `{slot}`. A query mentions an
optional parameter by its "mention" phrase, with `{}` the value ("in {}"),
added before the template's final punctuation. TYPE is one of

    int LOW HIGH          an integer                 num LOW HIGH STEP  a number
    enum a, b, c          a string of those          enum LIST          one of a word list
    code PATTERN          a string, "#" a digit and "@" a capital letter
    flag                  a boolean, default false; "mention" has no `{}`
    list ITEM             2 to 4 distinct ITEMs      list 3-6 ITEM      3 to 6 of them
    qlist ITEM            as list, said in quotes    any LIST           unconstrained, from LIST
    record TEMPLATE       an object: its properties on the lines below, indented two
                          more, all required; the query says it by TEMPLATE
    LIST                  a string from a word list, or a kind `world.KINDS` makes

Every family has at least one flat function (no list or object parameter) and
one nested function (a required list or object parameter).
"""

from __future__ import annotations

from collections.abc import Mapping

_WORD_LISTS = """
city: Lisbon, Oslo, Nairobi, Toronto, Osaka, Lima, Prague, Dublin, Seoul, Cairo, Denver, Austin,
  Porto, Vienna, Madrid, Munich, Helsinki, Auckland, Santiago, Bogota, Hanoi, Mumbai, Istanbul,
  Athens, Warsaw, Budapest, Montreal, Chicago, Boston, Sydney, Singapore, Jakarta, Manila, Zurich,
  Geneva, Copenhagen, Stockholm, Edinburgh, Seattle, Phoenix, Kyoto, Busan, Accra, Lagos, Tunis,
  Quito, Havana, Reykjavik
country: Portugal, Norway, Kenya, Canada, Japan, Peru, Ireland, Egypt, Mexico, Brazil, Chile, Spain,
  Italy, Germany, France, Greece, Poland, India, Vietnam, Ghana, Morocco, Sweden, Finland, Iceland,
  Australia, Argentina, New Zealand, South Korea, the Netherlands, the United States
person: Ana Ruiz, Tom Becker, Priya Nair, Kenji Mori, Lena Vogel, Omar Haddad, Sofia Rossi,
  Liam Walsh, Mei Chen, Jonas Berg, Amara Obi, Diego Silva, Nora Lind, Felix Wagner, Hana Kim,
  Ravi Patel, Elena Petrova, Sam Carter, Ines Moreau, Yusuf Demir, Clara Bennett, Marco Bianchi,
  Aisha Bello, Leo Novak
landmark: Central Station, City Museum, Riverside Park, Old Town Square, Harbor Market,
  University Library, Botanical Garden, Main Post Office, Grand Theater, North Stadium,
  Clock Tower, Fish Market
street_name: Rose Street, Elm Avenue, Harbor Road, King Street, Mill Lane, Park Avenue,
  Station Road, Oak Drive
phrase: good morning, where is the train station, thank you very much, the bill please,
  I am allergic to nuts, how much does this cost, see you tomorrow, happy birthday,
  the meeting is cancelled, please close the door, I would like a coffee
foreign_phrase: bonjour tout le monde, buenos dias amigos, guten Abend zusammen,
  obrigado pela ajuda, grazie mille, dank je wel, tack for maten, hyvaa huomenta, kiitos paljon
language: French, Spanish, German, Italian, Portuguese, Japanese, Korean, Dutch, Swedish, Polish,
  Turkish, Greek
ticker: AAPL, MSFT, GOOG, AMZN, NVDA, TSLA, META, NFLX, IBM, ORCL, INTC, AMD, SHOP, UBER, ADBE
currency: USD, EUR, GBP, JPY, CHF, CAD, AUD, SEK, NOK, INR, BRL, MXN
song: Paper Lanterns, Northern Lights, Golden Hour, Slow River, Glass Houses, Midnight Train,
  Summer Rain, Blue Horizon, Silver Lining, Open Roads
artist: The Lumens, Mara Vance, Kite Theory, Jonah Reyes, Velvet Orchard, Nova Hale,
  The Driftwoods, Ira Okafor
book: The Quiet Harbor, Atlas of Small Things, A Winter in Prague, The Glass Orchard,
  Maps of the Sea, The Last Lighthouse, Salt and Stone, Letters from Lima
author: Helen Marsh, Rafael Ortiz, Ingrid Dahl, Samuel Okoro, Yuki Tanaka, Greta Holm
movie: The Long Summer, Night Harbor, Red Canyon, The Ninth Wave, Iron Meadow, Silent Orbit,
  The Cartographer, Paper Moon Rising
dish: lasagna, pad thai, shakshuka, risotto, banana bread, chili con carne, miso soup, paella,
  apple pie, falafel, ramen, goulash
ingredient: eggs, flour, milk, butter, garlic, onion, tomatoes, rice, chickpeas, spinach, lemon,
  honey, cheese, basil, potatoes, mushrooms, carrots, ginger, tofu, chicken, salmon, lentils
food: apple, banana, oatmeal, almonds, avocado, brown rice, broccoli, yogurt, quinoa, cheddar,
  peanut butter, sweet potato
hotel: Hotel Aurora, The Grand Meridian, Harbor View Inn, Casa Azul, The Linden Hotel,
  Parkside Suites, Hotel Solstice, The Copper Lantern
restaurant: Trattoria Sole, Blue Lotus, El Faro, The Olive Branch, Sakura House, Le Petit Four,
  Spice Route, The Green Fork
event_title: team standup, dentist appointment, project review, budget meeting, yoga class,
  book club, quarterly planning, parent evening
subject: Quarterly report, Lunch on Friday, Invoice 2291, Trip itinerary, Welcome aboard,
  Meeting notes
message: See you at noon, The report is attached, Running ten minutes late, Call me when you land,
  The meeting moved to Friday, Dinner is at seven, Thanks for your help
team: Harbor City FC, Red Valley United, Northside Rovers, Eastport Comets, Lakeside Wolves,
  Summit Athletic, Riverside Rangers, Pine Hill Hawks
job: data analyst, nurse, software engineer, graphic designer, teacher, product manager, chef,
  mechanic, web developer, pharmacist
word: serendipity, ephemeral, ubiquitous, meticulous, resilient, candid, lucid, benevolent,
  arduous, pragmatic, eloquent, tenacious
misspelling: recieve, seperate, definately, occured, accomodate, neccessary, wierd, goverment
plant: basil, lavender, rosemary, fern, cactus, sunflower, mint, peony, snake plant, monstera,
  tomato plant, begonia
garage: Central Garage, Harbor Lot, Station Parking, Market Street Garage, Pier 9
tariff: Green Saver, Fixed 12, Night Owl, Flex Plus, Solar Share, Basic Home
group: Book Club, Hiking Crew, Family, Project Falcon, Weekend Plans
playlist: Road Trip, Focus, Sunday Morning, Workout Mix, Rainy Days
keyword: electric cars, solar power, housing prices, space launch, interest rates, climate policy,
  ocean cleanup, public transport
post: Excited to start my new job today, Our team just shipped version 2,
  Looking for book recommendations, Great hike this morning
symptom: headache, fever, sore throat, cough, fatigue, nausea, dizziness
url_host: example.com, shop.example.org, blog.example.net
url_path: spring-sale, about, docs/start, news/2025, team, faq
setting: theme, language, timezone, font_size, start_page, currency
setting_value: dark, en-GB, Europe/Lisbon, 14, inbox, EUR, compact
activity: running, cycling, swimming, rowing, walking, yoga
species: dog, cat, rabbit, parrot, hamster, turtle
planet: Mercury, Venus, Mars, Jupiter, Saturn
course_prefix: BIO, CHEM, HIST, ECON, PHIL
pet_name: Biscuit, Luna, Milo, Pepper, Rex, Coco, Ziggy, Mochi
subject_area: biology, chemistry, history, economics, philosophy, literature, physics
specialty: dermatology, cardiology, pediatrics, dentistry, physiotherapy
temperature_unit: celsius, fahrenheit
length_unit: meters, kilometers, miles, feet, inches
weight_unit: grams, kilograms, pounds, ounces
"""


def word_lists(text: str) -> dict[str, tuple[str, ...]]:
    """The lists of `text`, written as `WORDS` is, by name."""
    lists: dict[str, list[str]] = {}
    name = ""
    for line in text.strip().splitlines():
        if not line.startswith(" "):
            name, line = line.split(": ", 1)
            lists[name] = []
        lists[name] += [w.strip() for w in line.split(",") if w.strip()]
    return {name: tuple(words) for name, words in lists.items()}


WORDS: Mapping[str, tuple[str, ...]] = word_lists(_WORD_LISTS)

NEAR_FAMILIES: tuple[frozenset[str], ...] = (
    frozenset({"calendar", "clinic"}),  # an appointment booked or put on the calendar
    frozenset({"stocks", "crypto"}),  # a price by ticker or by coin
    frozenset({"sports", "news"}),  # a result, or the sports news
    frozenset({"maps", "parking"}),  # places near a landmark
    frozenset({"weather", "astronomy", "gardening"}),  # a city's sky, season and frost
)
"""Families whose functions a model might take for each other's: an irrelevance row that asks
one of a group offers none of the group."""

API_TABLE = """
[weather]
  get_forecast: Get the weather forecast for a city.
    city: city | The city to forecast.
    unit: enum temperature_unit = celsius "in {}" | Temperature unit.
    days: int 2 14 = 3 "for the next {} days" | How many days to forecast.
    > What's the weather going to be in {city}? | Give me the weather forecast for {city}.
    > How will the weather be in {city}?
  air_quality: Get the current air quality index of a city.
    city: city | The city to check.
    pollutant: enum pm25, pm10, ozone, no2 = pm25 "for {}" | Pollutant to report.
    > How clean is the air in {city} right now? | Check the air quality in {city}.
    > What's the current air quality index in {city}?
  compare_temperatures: Compare the current temperatures of several cities.
    cities: list city | The cities to compare.
    unit: enum temperature_unit = celsius "in {}" | Temperature unit.
    > Compare today's temperatures in {cities}. | Which is warmest right now: {cities}?
    > Show me current temperatures side by side for {cities}.
[flights]
  search_flights: Search flights between two cities on a date.
    origin: city | City of departure.
    destination: city | City of arrival.
    date: date | Departure date as YYYY-MM-DD.
    cabin: enum economy, premium, business, first = economy "in {} class" | Cabin class.
    passengers: int 1 9 = 1 "for {} passengers" | Number of passengers.
    > Find flights from {origin} to {destination} on {date}.
    > Are there any flights from {origin} to {destination} on {date}?
    > Search for a flight on {date} from {origin} to {destination}.
  flight_status: Get the live status of a flight.
    flight_number: code @@### | Airline code and number, e.g. QX482.
    > Is flight {flight_number} on time? | What's the status of flight {flight_number}?
    > Check whether flight {flight_number} is delayed.
  book_flight: Book a seat on a flight for one passenger.
    flight_number: code @@### | Airline code and number, e.g. QX482.
    passenger: record {name}, age {age} | The passenger.
      name: person | Full name as on the passport.
      age: int 1 99 | Age in years.
    seat: enum window, aisle, any = any "with {} seating" | Seat preference.
    > Book flight {flight_number} for {passenger}.
    > Please reserve a seat on flight {flight_number} for passenger {passenger}.
    > I want to book {flight_number}; the traveller is {passenger}.
[hotels]
  search_hotels: Search hotels with free rooms in a city.
    city: city | City to stay in.
    check_in: date | Check-in date as YYYY-MM-DD.
    nights: int 2 21 | Length of stay in nights.
    guests: int 1 8 = 2 "for a party of {}" | Number of guests.
    max_price: num 50 1000 10 = 1000 "under {} USD a night" | Highest price per night in USD.
    > Find a hotel in {city} from {check_in} for {nights} nights.
    > I need somewhere to stay in {city}, checking in {check_in} for {nights} nights.
    > Search hotels in {city} with check-in {check_in} for {nights} nights.
  hotel_reviews: Get guest reviews of a hotel.
    hotel: hotel | Name of the hotel.
    limit: int 1 50 = 10 "showing up to {} reviews" | Most reviews to return.
    > What do guests say about {hotel}? | Show me reviews of {hotel}.
    > Get the latest reviews for {hotel}.
  book_room: Book a hotel room for one guest.
    hotel: hotel | Name of the hotel.
    check_in: date | Check-in date as YYYY-MM-DD.
    guest: record {name} (phone {phone}) | The guest.
      name: person | Guest's full name.
      phone: phone | Guest's phone number.
    > Book a room at {hotel} from {check_in} for {guest}.
    > Reserve {hotel} checking in {check_in}; the guest is {guest}.
    > Make a hotel booking at {hotel} on {check_in} for {guest}.
[recipes]
  find_recipes: Find recipes that use the given ingredients.
    ingredients: list ingredient | Ingredients to cook with.
    diet: enum any, vegetarian, vegan, gluten-free = any "that are {}" | Dietary restriction.
    > What can I cook with {ingredients}? | Find recipes that use {ingredients}.
    > Suggest dishes made from {ingredients}.
  recipe_steps: Get the steps of a recipe.
    dish: dish | Name of the dish.
    servings: int 1 12 = 4 "for {} people" | Number of servings.
    > How do I make {dish}? | Give me a recipe for {dish}. | Show the steps to cook {dish}.
  cooking_time: Estimate how long a dish takes to cook.
    dish: dish | Name of the dish.
    method: enum oven, stovetop, slow cooker, air fryer = oven "in the {}" | Cooking method.
    > How long does {dish} take to cook? | What's the cooking time for {dish}?
    > Estimate how long it takes to prepare {dish}.
[stocks]
  get_quote: Get the latest price of a stock.
    ticker: ticker | Stock ticker symbol.
    > What's {ticker} trading at? | Get the current stock price of {ticker}.
    > How much is one share of {ticker} right now?
  price_history: Get a stock's historical prices from a start date.
    ticker: ticker | Stock ticker symbol.
    start_date: date | First day as YYYY-MM-DD.
    interval: enum daily, weekly, monthly = daily "at {} intervals" | Spacing of the prices.
    > Show {ticker}'s price history since {start_date}.
    > How has {ticker} moved since {start_date}?
    > Get historical prices for {ticker} starting {start_date}.
  compare_returns: Compare the returns of several stocks.
    tickers: list ticker | Ticker symbols to compare.
    period: enum 1m, 6m, 1y, 5y = 1y "over {}" | Period of the returns.
    > Compare the returns of {tickers}. | Which performed best: {tickers}?
    > Show me how {tickers} did against each other.
[translation]
  translate_text: Translate a text into another language.
    text: phrase | The text to translate.
    target_language: enum language | Language to translate into.
    formality: enum formal, informal, neutral = neutral "keeping it {}" | Tone of the translation.
    > Translate '{text}' into {target_language}. | How do you say '{text}' in {target_language}?
    > What is '{text}' in {target_language}?
  detect_language: Detect which language a text is written in.
    text: foreign_phrase | The text to identify.
    > What language is '{text}'? | Detect the language of '{text}'.
    > Which language is this: '{text}'?
  translate_batch: Translate several phrases into one language.
    phrases: qlist phrase | The phrases to translate.
    target_language: enum language | Language to translate into.
    > Translate {phrases} into {target_language}. | How do I say {phrases} in {target_language}?
    > Give me the {target_language} for {phrases}.
[units]
  convert_length: Convert a length between units.
    value: num 0.5 500 0.5 | The length to convert.
    from_unit: enum length_unit | Unit of the value.
    to_unit: enum length_unit | Unit to convert to.
    > Convert {value} {from_unit} to {to_unit}. | How many {to_unit} is {value} {from_unit}?
    > What is {value} {from_unit} in {to_unit}?
  convert_weight: Convert a weight between units.
    value: num 0.5 500 0.5 | The weight to convert.
    from_unit: enum weight_unit | Unit of the value.
    to_unit: enum weight_unit | Unit to convert to.
    > Convert {value} {from_unit} to {to_unit}. | How many {to_unit} are {value} {from_unit}?
    > What do {value} {from_unit} weigh in {to_unit}?
  convert_lengths: Convert several lengths from one unit to another.
    values: list num 0.5 500 0.5 | The lengths to convert.
    from_unit: enum length_unit | Unit of the values.
    to_unit: enum length_unit | Unit to convert to.
    > Convert {values} {from_unit} to {to_unit}. | Express {values} {from_unit} in {to_unit}.
    > What are {values} {from_unit} in {to_unit}?
[calendar]
  create_event: Create an event on the user's calendar.
    title: event_title | Title of the event.
    date: date | Date as YYYY-MM-DD.
    start_time: time | Start time as HH:MM, 24-hour clock.
    duration_minutes: int 5 480 = 60 "lasting {} minutes" | Length in minutes.
    > Put '{title}' on my calendar on {date} at {start_time}.
    > Schedule '{title}' for {date} at {start_time}.
    > Create a calendar event called '{title}' on {date} starting {start_time}.
  list_events: List the events on one day.
    date: date | Date as YYYY-MM-DD.
    calendar: enum work, personal, family = work "on my {} calendar" | Which calendar.
    > What's on my calendar on {date}? | List my events for {date}.
    > Do I have anything scheduled on {date}?
  invite_attendees: Invite people to a calendar event by email.
    title: event_title | Title of the event.
    emails: list email | Email addresses to invite.
    > Invite {emails} to '{title}'. | Send an invitation for '{title}' to {emails}.
    > Add {emails} as guests to '{title}'.
[music]
  search_songs: Search songs by an artist.
    artist: artist | Name of the artist.
    genre: enum any, pop, rock, jazz, folk, electronic = any "in the {} genre" | Genre filter.
    limit: int 1 50 = 10 "limited to {} results" | Most songs to return.
    > Find songs by {artist}. | What songs has {artist} released? | Search for tracks by {artist}.
  get_lyrics: Get the lyrics of a song.
    song: song | Title of the song.
    artist: artist | Name of the artist.
    > Show me the lyrics of '{song}' by {artist}. | What are the words to '{song}' by {artist}?
    > Get the lyrics for {artist}'s '{song}'.
  create_playlist: Create a playlist of songs.
    name: playlist | Name of the playlist.
    songs: qlist song | Song titles to add.
    public: flag = false "and make it public" | Whether anyone can see the playlist.
    > Make a playlist called '{name}' with {songs}.
    > Create a new playlist '{name}' containing {songs}.
    > Put {songs} into a playlist named '{name}'.
[maps]
  get_directions: Get directions between two places.
    origin: landmark | Where to start.
    destination: landmark | Where to go.
    mode: enum car, foot, bike, transit = car "by {}" | How to travel.
    > How do I get from {origin} to {destination}?
    > Give me directions from {origin} to {destination}.
    > What's the route from {origin} to {destination}?
  find_nearby: Find places of one type near a landmark.
    place_type: enum cafe, pharmacy, bakery, gas station, supermarket | Kind of place.
    near: landmark | Landmark to search around.
    radius_km: num 0.5 10 0.5 = 1 "within {} km" | Search radius in km.
    > Find a {place_type} near {near}. | Is there a {place_type} close to {near}?
    > Where's the nearest {place_type} to {near}?
  plan_route: Plan a route through several stops.
    stops: list landmark | Places to visit, in the given order.
    avoid_tolls: flag = false "avoiding toll roads" | Whether to avoid toll roads.
    > Plan a route that visits {stops}. | Map out a trip through {stops}.
    > I need to stop at {stops}; plan the route.
[shipping]
  shipping_rates: Quote the cost of shipping a parcel abroad.
    weight_kg: num 0.5 30 0.5 | Weight of the parcel in kg.
    destination_country: country | Country to ship to.
    service: enum standard, express, overnight = standard "with {} service" | Speed of delivery.
    > How much does it cost to ship a parcel of {weight_kg} kg to {destination_country}?
    > Get shipping rates for {weight_kg} kg to {destination_country}.
    > Quote me postage for a box of {weight_kg} kg going to {destination_country}.
  track_package: Track a parcel by its tracking number.
    tracking_number: code 1Z########## | The parcel's tracking number.
    > Where is my package {tracking_number}? | Track shipment {tracking_number}.
    > What's the status of parcel {tracking_number}?
  create_shipment: Create a shipment to a recipient.
    recipient: record {name}, {street}, {city} | Who receives the parcel.
      name: person | Recipient's full name.
      street: street | Street address.
      city: city | City.
    weight_kg: num 0.5 30 0.5 | Weight of the parcel in kg.
    > Create a shipment of {weight_kg} kg to {recipient}.
    > Send a parcel of {weight_kg} kg to {recipient}.
    > Ship {weight_kg} kg addressed to {recipient}.
[fitness]
  log_workout: Log a workout.
    activity: enum activity | Kind of exercise.
    duration_minutes: int 5 300 | Length in minutes.
    distance_km: num 0 100 0.5 = 0 "covering {} km" | Distance covered in km.
    > Log a {activity} workout of {duration_minutes} minutes.
    > Record {activity} for {duration_minutes} minutes.
    > Add a workout: {activity}, {duration_minutes} minutes.
  calories_burned: Estimate the calories a workout burns.
    activity: enum activity | Kind of exercise.
    duration_minutes: int 5 300 | Length in minutes.
    weight_kg: num 40 150 0.5 | Body weight in kg.
    > How many calories does {duration_minutes} minutes of {activity} burn at {weight_kg} kg?
    > Estimate calories burned: {activity} for {duration_minutes} minutes at {weight_kg} kg.
    > I weigh {weight_kg} kg; how many calories do {duration_minutes} minutes of {activity} burn?
  weekly_plan: Build a weekly training plan from several activities.
    activities: list enum activity | Activities to include.
    days_per_week: int 1 7 = 3 "on {} days a week" | Training days a week.
    > Build me a weekly training plan with {activities}.
    > Plan a week of workouts mixing {activities}.
    > Create a fitness schedule that includes {activities}.
[library]
  search_catalog: Search the library catalog by author.
    author: author | Name of the author.
    available_only: flag = false "that are available now" | Only books on the shelf now.
    format: enum print, ebook, audiobook = print "as {}" | Format of the books.
    > Find books by {author}. | What does the library have by {author}?
    > Search the catalog for books by {author}.
  check_availability: Check whether a book can be borrowed.
    title: book | Title of the book.
    branch: enum central, north, east, riverside = central "at the {} branch" | Library branch.
    > Is '{title}' available? | Can I borrow '{title}' right now?
    > Check whether '{title}' is on the shelf.
  place_hold: Place a hold on a book for a member.
    title: book | Title of the book.
    member: record {name}, card {card_number} | The member.
      name: person | Member's full name.
      card_number: code LIB-##### | Library card number.
    > Place a hold on '{title}' for {member}. | Reserve '{title}' for library member {member}.
    > Put '{title}' on hold for {member}.
[banking]
  get_balance: Get the balance of a bank account.
    account_id: account | Account number.
    > What's the balance of account {account_id}? | How much money is in {account_id}?
    > Check the balance on account {account_id}.
  transfer_funds: Move money between two accounts.
    from_account: account | Account to take the money from.
    to_account: account | Account to pay into.
    amount: num 5 5000 5 | Amount to move.
    currency: enum USD, EUR, GBP = USD "in {}" | Currency of the amount.
    > Transfer {amount} from {from_account} to {to_account}.
    > Move {amount} from account {from_account} into {to_account}.
    > Send {amount} from {from_account} to account {to_account}.
  add_payee: Save a new payee.
    payee: record {name} with account {account} | The payee.
      name: person | Payee's full name.
      account: account | Payee's account number.
    > Add {payee} as a payee. | Save a new payee: {payee}.
    > Register {payee} as someone I can pay.
[currency]
  convert_currency: Convert an amount of money into another currency.
    amount: num 1 10000 1 | Amount to convert.
    from_currency: enum currency | Currency of the amount.
    to_currency: enum currency | Currency to convert to.
    > Convert {amount} {from_currency} to {to_currency}.
    > How much is {amount} {from_currency} in {to_currency}?
    > What do {amount} {from_currency} come to in {to_currency}?
  exchange_rate: Get the exchange rate between two currencies.
    base: enum currency | Currency to price.
    quote: enum currency | Currency to price in.
    date: date = latest "on {}" | Day of the rate as YYYY-MM-DD.
    > What's the {base} to {quote} exchange rate?
    > Give me the exchange rate from {base} to {quote}. | How many {quote} does one {base} buy?
  rate_table: List the rates of one currency against several others.
    base: enum currency | Currency to price.
    currencies: list enum currency | Currencies to price it in.
    > Show {base} exchange rates against {currencies}. | List rates from {base} to {currencies}.
    > How does {base} compare with {currencies} today?
[news]
  top_headlines: Get today's top headlines on a topic.
    topic: enum business, technology, sports, science, health, travel | Topic of the news.
    country: country = the United States "from {}" | Country whose news to show.
    > What are today's top {topic} headlines? | Show me the latest {topic} news.
    > Any big {topic} stories today?
  search_articles: Search news articles by keywords.
    keywords: list keyword | Keywords the articles mention.
    since: date = 2025-01-01 "published since {}" | Earliest publication date as YYYY-MM-DD.
    > Find news articles about {keywords}. | Search the news for {keywords}.
    > Any recent articles mentioning {keywords}?
[movies]
  showtimes: Find when a movie plays in a city on a date.
    movie: movie | Title of the movie.
    city: city | City of the cinema.
    date: date | Date as YYYY-MM-DD.
    > When is '{movie}' playing in {city} on {date}?
    > Find showtimes for '{movie}' in {city} on {date}.
    > What times can I see '{movie}' in {city} on {date}?
  movie_details: Get the plot, rating and runtime of a movie.
    title: movie | Title of the movie.
    include_cast: flag = false "including the cast" | Whether to list the cast.
    > Tell me about the movie '{title}'. | Get details on the film '{title}'.
    > What is '{title}' about?
  book_seats: Book cinema seats for a screening.
    movie: movie | Title of the movie.
    date: date | Date as YYYY-MM-DD.
    seats: list seat | Seat codes such as C7.
    > Book seats {seats} for '{movie}' on {date}.
    > Reserve {seats} at the '{movie}' screening on {date}.
    > I want seats {seats} for '{movie}' on {date}.
[restaurants]
  find_restaurants: Find restaurants of a cuisine in a city.
    city: city | City to search.
    cuisine: enum Italian, Japanese, Mexican, Indian, Thai, Greek, Lebanese, Korean | Kind of food.
    price: enum budget, moderate, upscale = moderate "in the {} range" | Price range.
    open_now: flag = false "that are open now" | Only places open now.
    > Find {cuisine} restaurants in {city}. | Where can I get {cuisine} food in {city}?
    > Recommend {cuisine} places in {city}.
  restaurant_menu: Get a restaurant's menu.
    restaurant: restaurant | Name of the restaurant.
    dietary: enum none, vegetarian, vegan, halal = none "with {} options" | Dietary filter.
    > Show me the menu at {restaurant}. | What's on the menu at {restaurant}?
    > Get the menu of {restaurant}.
  reserve_table: Reserve a restaurant table.
    restaurant: restaurant | Name of the restaurant.
    date: date | Date as YYYY-MM-DD.
    time: time | Time as HH:MM.
    party: record {size} people under the name {name} | Who is coming.
      name: person | Name for the booking.
      size: int 2 12 | Number of people.
    > Book a table at {restaurant} on {date} at {time} for {party}.
    > Reserve {restaurant} for {date} at {time}: {party}.
    > Can you get us a table at {restaurant} on {date} at {time} for {party}?
[math]
  factorial: Compute the factorial of a whole number.
    n: int 0 20 | The number.
    > What is the factorial of {n}? | Compute {n}! | Calculate {n} factorial.
  gcd: Compute the greatest common divisor of two whole numbers.
    a: int 2 1000 | First number.
    b: int 2 1000 | Second number.
    > What's the greatest common divisor of {a} and {b}? | Find the GCD of {a} and {b}.
    > Compute gcd({a}, {b}).
  lcm: Compute the least common multiple of whole numbers.
    numbers: list int 2 60 | The numbers.
    > What is the least common multiple of {numbers}? | Find the LCM of {numbers}.
    > Compute the lowest common multiple of {numbers}.
[geometry]
  circle_area: Compute the area of a circle.
    radius: num 0.5 100 0.5 | Radius of the circle.
    unit: enum cm, m, in, ft = cm "measured in {}" | Unit of the radius.
    > What's the area of a circle with radius {radius}?
    > Calculate the area of a circle whose radius is {radius}.
    > Find the area of a circle of radius {radius}.
  rectangle_area: Compute the area of a rectangle.
    length: num 0.5 100 0.5 | Length of the rectangle.
    width: num 0.5 100 0.5 | Width of the rectangle.
    > What's the area of a rectangle {length} by {width}?
    > Compute the area of a rectangle with length {length} and width {width}.
    > How big is a rectangle that is {length} long and {width} wide?
  point_distance: Compute the distance between two points in the plane.
    a: record ({x}, {y}) | First point.
      x: num -50 50 0.5 | x coordinate.
      y: num -50 50 0.5 | y coordinate.
    b: record ({x}, {y}) | Second point.
      x: num -50 50 0.5 | x coordinate.
      y: num -50 50 0.5 | y coordinate.
    > How far apart are the points {a} and {b}? | Compute the distance between {a} and {b}.
    > What is the distance from point {a} to point {b}?
[statistics]
  mean: Compute the arithmetic mean of numbers.
    numbers: list 3-6 num 0 100 0.5 | The numbers.
    > What is the average of {numbers}? | Compute the mean of {numbers}.
    > Find the arithmetic mean of {numbers}.
  standard_deviation: Compute the standard deviation of numbers.
    numbers: list 3-6 num 0 100 0.5 | The numbers.
    sample: flag = false "treating them as a sample" | Whether the numbers are a sample.
    > What is the standard deviation of {numbers}? | Compute the spread of {numbers}.
    > Find the standard deviation of {numbers}.
  z_score: Compute how many standard deviations a value is from the mean.
    value: num 0 200 0.5 | The value.
    mean: num 0 200 0.5 | The mean.
    std_dev: num 0.5 50 0.5 | The standard deviation.
    > What's the z-score of {value} if the mean is {mean} and the standard deviation is {std_dev}?
    > Standardise {value} given mean {mean} and standard deviation {std_dev}.
    > Compute the z-score for {value} with mean {mean} and std dev {std_dev}.
[email]
  send_email: Send an email.
    to: email | Recipient's address.
    subject: subject | Subject line.
    body: message | Text of the message.
    urgent: flag = false "and mark it urgent" | Whether to mark the email urgent.
    > Email {to} with the subject '{subject}' saying '{body}'.
    > Send an email to {to}, subject '{subject}', message '{body}'.
    > Write to {to} about '{subject}': '{body}'.
  search_inbox: Search the inbox for emails from a sender.
    sender: email | Sender's address.
    unread_only: flag = false "but only unread ones" | Only unread emails.
    limit: int 1 100 = 20 "showing at most {}" | Most emails to return.
    > Find emails from {sender}. | Show me messages that {sender} sent me.
    > Search my inbox for mail from {sender}.
  send_group_email: Send one email to several recipients.
    recipients: list email | Recipients' addresses.
    subject: subject | Subject line.
    > Email {recipients} with the subject '{subject}'.
    > Send a message titled '{subject}' to {recipients}.
    > Write one email to {recipients} about '{subject}'.
[messaging]
  send_sms: Send a text message to a phone number.
    phone_number: phone | Recipient's phone number.
    message: message | Text of the message.
    > Text {phone_number}: '{message}'. | Send an SMS to {phone_number} saying '{message}'.
    > Message {phone_number} with '{message}'.
  block_number: Block calls and texts from a phone number.
    phone_number: phone | Number to block.
    report_spam: flag = false "and report it as spam" | Whether to report the number as spam.
    > Block {phone_number}. | Stop all messages from {phone_number}.
    > Please block the number {phone_number}.
  create_group: Create a group chat.
    name: group | Name of the group.
    members: list person | People to add.
    > Create a group chat called '{name}' with {members}.
    > Start a group '{name}' including {members}.
    > Make a chat group named '{name}' for {members}.
[real_estate]
  search_listings: Search homes for sale in a city.
    city: city | City to search.
    max_price: num 100000 2000000 5000 | Highest price in USD.
    bedrooms: int 1 6 = 1 "with at least {} bedrooms" | Fewest bedrooms.
    > Find homes for sale in {city} under {max_price} dollars.
    > Show listings in {city} priced up to {max_price} USD.
    > What houses can I buy in {city} for at most {max_price} dollars?
  mortgage_payment: Estimate the monthly payment of a mortgage.
    price: num 100000 2000000 5000 | Price of the home in USD.
    down_payment: num 5000 400000 5000 | Down payment in USD.
    years: int 5 40 = 30 "over {} years" | Term of the loan in years.
    rate_percent: num 1 12 0.25 = 6.5 "at {} percent interest" | Yearly interest rate in percent.
    > What would the monthly payment be on a home costing {price} dollars with {down_payment} down?
    > Estimate my mortgage for a house at {price} USD putting {down_payment} down.
    > Calculate a mortgage payment: price {price}, down payment {down_payment}.
  compare_listings: Compare several listings side by side.
    listing_ids: list code LST-#### | Ids of the listings.
    > Compare listings {listing_ids}. | Put {listing_ids} side by side.
    > Which is the better deal: {listing_ids}?
[car_rental]
  search_cars: Search rental cars in a city.
    city: city | City to pick the car up in.
    pickup_date: date | Pickup date as YYYY-MM-DD.
    days: int 2 30 | Length of the rental in days.
    car_class: enum compact, midsize, luxury, minivan = compact "in the {} class" | Size of car.
    > Find a rental car in {city} from {pickup_date} for {days} days.
    > I need to rent a car in {city} on {pickup_date} for {days} days.
    > Search car rentals in {city}, pickup {pickup_date}, for {days} days.
  book_car: Book a rental car for a driver.
    car_class: enum compact, midsize, luxury, minivan | Size of car.
    pickup_date: date | Pickup date as YYYY-MM-DD.
    driver: record {name}, age {age} | The driver.
      name: person | Driver's full name.
      age: int 21 80 | Driver's age.
    > Book a {car_class} car from {pickup_date} for driver {driver}.
    > Reserve a {car_class} rental starting {pickup_date}; the driver is {driver}.
    > Rent a {car_class} on {pickup_date} for {driver}.
[sports]
  game_result: Get the result of a team's game on a date.
    team: team | Name of the team.
    date: date | Date as YYYY-MM-DD.
    > What was the score of the {team} game on {date}? | How did {team} do on {date}?
    > Get the result of the {team} match on {date}.
  standings: Get a league table.
    league: enum Premier League, La Liga, Bundesliga, Serie A, Ligue 1 | Name of the league.
    season: int 2000 2025 = 2025 "for the {} season" | Year the season started.
    > Show the {league} table. | What are the current {league} standings?
    > Who is leading the league in {league}?
  compare_players: Compare the statistics of several players.
    players: list person | Names of the players.
    stat: enum goals, assists, appearances = goals "by {}" | Statistic to compare.
    > Compare the players {players}. | Who is better: {players}?
    > Show stats for {players} side by side.
[nutrition]
  food_facts: Get the nutrition facts of a food.
    food: food | Name of the food.
    serving_grams: int 10 500 = 100 "per {} grams" | Serving size in grams.
    > How many calories are in {food}? | Give me nutrition facts for {food}.
    > What's the nutritional value of {food}?
  meal_totals: Add up the nutrition of a meal of several foods.
    foods: list food | Foods in the meal.
    > Add up the nutrition of a meal with {foods}. | What are the total calories in {foods}?
    > Calculate the macros for a plate of {foods}.
[timezones]
  current_time: Get the local time in a city.
    city: city | The city.
    > What time is it in {city}? | Tell me the local time in {city}.
    > What's the current time in {city}?
  convert_time: Convert a time of day from one city's time zone to another's.
    time: time | Time as HH:MM.
    from_city: city | City the time is in.
    to_city: city | City to convert to.
    > If it's {time} in {from_city}, what time is it in {to_city}?
    > Convert {time} {from_city} time to {to_city} time.
    > What is {time} in {from_city} in {to_city} local time?
  world_clock: Show the local time in several cities.
    cities: list city | The cities.
    > Show the current time in {cities}. | What time is it now in {cities}?
    > Give me a world clock for {cities}.
[dictionary]
  define: Get the definition of a word.
    word: word | The word.
    examples: flag = false "with example sentences" | Whether to add example sentences.
    > What does '{word}' mean? | Define '{word}'. | Give me the definition of '{word}'.
  synonyms: Get synonyms of a word.
    word: word | The word.
    limit: int 1 20 = 5 "limited to {} words" | Most synonyms to return.
    > What are some synonyms for '{word}'? | Find words that mean the same as '{word}'.
    > Give me synonyms of '{word}'.
  spell_check: Check the spelling of several words.
    words: list misspelling | The words to check.
    > Are these spelled right: {words}? | Spell-check {words}. | Check the spelling of {words}.
[crypto]
  coin_price: Get the price of a cryptocurrency.
    coin: enum bitcoin, ethereum, solana, cardano, litecoin | The coin.
    currency: enum USD, EUR, GBP = USD "in {}" | Currency of the price.
    > What's the price of {coin}? | How much is one {coin} worth? | Get the current {coin} price.
  price_alert: Alert the user when a coin reaches a price.
    alert: record {coin} reaches {target_price} USD | What to watch.
      coin: enum bitcoin, ethereum, solana, cardano, litecoin | The coin.
      target_price: num 1 100000 1 | Price in USD.
    channel: enum push, email, sms = push "by {}" | How to alert.
    > Alert me when {alert}. | Set a price alert for when {alert}. | Notify me once {alert}.
[jobs]
  search_jobs: Search job openings by title and city.
    title: job | Job title.
    city: city | City of the job.
    remote: flag = false "that allow remote work" | Only jobs that allow remote work.
    > Find {title} jobs in {city}. | Are there any openings for a {title} in {city}?
    > Search job listings for {title} roles in {city}.
  salary_estimate: Estimate the typical salary of a job in a city.
    title: job | Job title.
    city: city | City of the job.
    > What does a {title} earn in {city}? | Estimate the salary for a {title} in {city}.
    > How much is a {title} paid in {city}?
  apply: Apply to a job posting.
    job_id: code JOB-##### | Id of the posting.
    applicant: record {name} with {years} years of experience | The applicant.
      name: person | Applicant's full name.
      years: int 2 30 | Years of experience.
    > Apply to job {job_id} as {applicant}. | Submit an application for {job_id}: {applicant}.
    > Send an application to posting {job_id} for {applicant}.
[concerts]
  find_concerts: Find concerts in a city on a date.
    city: city | City of the concert.
    date: date | Date as YYYY-MM-DD.
    > Find concerts in {city} on {date}. | What gigs are on in {city} on {date}?
    > Any live music in {city} on {date}?
  buy_tickets: Buy concert tickets in people's names.
    event_id: code EVT-##### | Id of the concert.
    holders: list person | Names on the tickets.
    section: enum standing, floor, balcony = standing "in the {} section" | Where to sit or stand.
    > Buy tickets for event {event_id} for {holders}.
    > Get {event_id} tickets in the names of {holders}.
    > Purchase concert tickets to {event_id} for {holders}.
[parking]
  find_parking: Find parking near a landmark.
    near: landmark | Landmark to park near.
    hours: int 2 24 | How long to park, in hours.
    covered: flag = false "with a covered spot" | Only covered parking.
    > Find parking near {near} for {hours} hours.
    > Where can I park close to {near} for {hours} hours?
    > I need a parking spot by {near} for {hours} hours.
  reserve_spot: Reserve a parking spot for a vehicle.
    garage: garage | Name of the garage.
    date: date | Date as YYYY-MM-DD.
    vehicle: record a {size} car with plate {plate} | The vehicle.
      plate: code @@@-#### | Licence plate.
      size: enum small, standard, large | Size of the car.
    > Reserve a spot at {garage} on {date} for {vehicle}.
    > Book parking at {garage} on {date} for {vehicle}.
    > Hold a space in {garage} on {date} for {vehicle}.
[pets]
  find_vet: Find vets in a city that treat a species.
    city: city | City to search.
    species: enum species | Kind of animal.
    emergency: flag = false "that handles emergencies" | Only vets that take emergencies.
    > Find a vet for my {species} in {city}. | Which vets in {city} treat a {species}?
    > I need a {species} vet in {city}.
  register_pet: Register a pet with the clinic.
    pet: record {name}, a {species} aged {age} | The pet.
      name: pet_name | The pet's name.
      species: enum species | Kind of animal.
      age: int 1 20 | Age in years.
    > Register my pet {pet}. | Add {pet} to the pet registry. | Sign up {pet} with the clinic.
[courses]
  search_courses: Search courses on a subject.
    subject: enum subject_area | The subject.
    level: enum beginner, intermediate, advanced = beginner "at the {} level" | Course level.
    > Find {subject} courses. | What {subject} classes are available?
    > Search for courses in {subject}.
  enroll: Enroll a student in a course.
    course_code: course | Code of the course, e.g. BIO101.
    student: record {name} (student {student_id}) | The student.
      name: person | Student's full name.
      student_id: code S-###### | Student number.
    > Enroll {student} in {course_code}. | Sign {student} up for {course_code}.
    > Register {student} for the course {course_code}.
[energy]
  meter_usage: Get the electricity a meter used in a month.
    meter_id: code MTR-##### | Id of the meter.
    month: month | Month as YYYY-MM.
    > How much electricity did meter {meter_id} use in {month}?
    > Get usage for meter {meter_id} for {month}.
    > Show the energy consumption of {meter_id} during {month}.
  report_outage: Report a power outage at a postal code.
    postal_code: code ##### | Postal code of the outage.
    > Report a power outage at {postal_code}. | The power is out in {postal_code}; report it.
    > Log an electricity outage for postal code {postal_code}.
  compare_tariffs: Compare the cost of several electricity tariffs.
    tariffs: list tariff | Names of the tariffs.
    monthly_kwh: int 50 2000 = 300 "for {} kWh a month" | Monthly use in kWh.
    > Compare the tariffs {tariffs}. | Which is cheaper: {tariffs}?
    > Price out the plans {tariffs} for me.
[social]
  post_update: Post a status update.
    text: post | Text of the post.
    platform: enum mastodon, bluesky, linkedin | Where to post.
    > Post '{text}' on {platform}. | Share '{text}' to {platform}.
    > Publish '{text}' on my {platform} account.
  follower_count: Get how many followers an account has.
    username: username | The account's handle.
    > How many followers does {username} have? | Get the follower count of {username}.
    > Check how many people follow {username}.
  tag_users: Tag users in a post.
    post_id: code POST-###### | Id of the post.
    usernames: list username | Handles to tag.
    > Tag {usernames} in post {post_id}. | Add {usernames} as tags on {post_id}.
    > Mention {usernames} on post {post_id}.
[inventory]
  check_stock: Check how many units of a product are in stock.
    sku: sku | Product code.
    warehouse: enum north, south, east, west = north "in the {} warehouse" | Warehouse to check.
    > How many units of {sku} are in stock? | Check inventory for {sku}. | Is {sku} in stock?
  restock: Order more units of a product.
    sku: sku | Product code.
    quantity: int 1 500 | Units to order.
    > Reorder {quantity} units of {sku}. | Restock {sku} with {quantity} units.
    > Add {quantity} more units of {sku} to inventory.
  create_order: Create a purchase order for several products.
    skus: list sku | Product codes.
    priority: enum low, normal, high = normal "with {} priority" | Order priority.
    > Create a purchase order for {skus}. | Order {skus} from the supplier.
    > Place an order covering {skus}.
[clinic]
  book_appointment: Book a medical appointment.
    specialty: enum specialty | Medical specialty.
    date: date | Date as YYYY-MM-DD.
    time: time | Time as HH:MM.
    > Book a {specialty} appointment on {date} at {time}.
    > Schedule a {specialty} visit for {date} at {time}.
    > I need a {specialty} appointment on {date} at {time}.
  symptom_checker: Suggest likely causes of symptoms.
    symptoms: list symptom | The symptoms.
    > I have {symptoms}; what could it be? | Check these symptoms: {symptoms}.
    > What might cause {symptoms}?
[links]
  shorten_url: Make a short link for a URL.
    url: url | The URL to shorten.
    > Shorten {url} for me. | Make a short link for {url} please.
    > Give me a tiny URL for {url} now.
  qr_code: Make a QR code that opens a URL.
    url: url | The URL to encode.
    size_px: int 100 1000 = 300 "at {} pixels" | Width of the image in pixels.
    > Make a QR code for {url} please. | Generate a QR code that links to {url} for me.
    > Create a QR image pointing at {url} now.
  check_links: Check whether several URLs respond.
    urls: list url | The URLs to check.
    > Check whether {urls} are up. | Are these links working: {urls}?
    > Test the links {urls} for me.
[astronomy]
  sun_times: Get sunrise and sunset times in a city on a date.
    city: city | The city.
    date: date | Date as YYYY-MM-DD.
    > When is sunrise in {city} on {date}? | Get sunrise and sunset times for {city} on {date}.
    > What time does the sun set in {city} on {date}?
  moon_phase: Get the phase of the moon on a date.
    date: date | Date as YYYY-MM-DD.
    > What's the moon phase on {date}? | Will the moon be full on {date}?
    > Show the lunar phase for {date}.
  planet_visibility: Check which planets are visible from a city tonight.
    planets: list enum planet | The planets.
    city: city | The city.
    > Can I see {planets} from {city} tonight? | Which of {planets} are visible from {city}?
    > Check the visibility of {planets} over {city}.
[gardening]
  plant_care: Get care instructions for a plant.
    plant: plant | Name of the plant.
    > How do I care for a {plant}? | Give me care tips for {plant}.
    > What does a {plant} need to thrive?
  frost_dates: Get the first and last frost dates of a city.
    city: city | The city.
    > When is the last frost in {city}? | Get frost dates for {city}.
    > When is it safe to plant outside in {city}?
  watering_schedule: Make a watering schedule for several plants.
    plants: list plant | Names of the plants.
    climate: enum dry, temperate, humid = temperate "in a {} climate" | Local climate.
    > Make a watering schedule for {plants}. | How often should I water {plants}?
    > Plan watering for my {plants}.
[settings]
  set_preference: Save one of the user's app settings.
    key: setting | Name of the setting.
    value: any setting_value | New value of the setting.
    > Set my '{key}' setting to '{value}'. | Change '{key}' to '{value}'.
    > Update the preference '{key}' so it is '{value}'.
  get_preference: Read one of the user's app settings.
    key: setting | Name of the setting.
    > What is my '{key}' setting? | Show the current value of '{key}'.
    > Read back the '{key}' preference.
  reset_preferences: Reset several settings to their defaults.
    keys: qlist setting | Names of the settings.
    > Reset {keys} to their defaults. | Put {keys} back to the default values.
    > Restore the default settings for {keys}.
"""
