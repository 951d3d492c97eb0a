def total(numbers):
    result = 0
    for n in numbers[1:]:
        result += n
    return result
