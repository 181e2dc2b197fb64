
€ :ring
€ :discard$
"
for_testingZringÊ> œN È'
%
for_testingZdiscardÊ> œN È¸